package natsx

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Auth is how a process proves who it is to NATS, beside a user/password or token in the
// URL. Fields are file paths, never the secrets themselves, so that nothing secret reaches
// a log line or an error.
type Auth struct {
	// Creds is a .creds file (a user JWT and its nkey seed), for a server in operator mode.
	Creds string
	// Nkey is a file holding an nkey user seed (SU…), for a server that lists users by nkey.
	Nkey string
	// CA is a PEM file of the CAs that sign the server's certificate (TLS).
	CA string
	// Cert and Key are a PEM client certificate and its key, for a server that verifies them.
	Cert, Key string
}

// Options are the nats.Options that present a.
func (a Auth) Options() ([]nats.Option, error) {
	var opts []nats.Option
	if a.Creds != "" && a.Nkey != "" {
		return nil, errors.New("a .creds file and an nkey seed exclude each other: give one")
	}
	if a.Creds != "" {
		if err := readable(a.Creds); err != nil {
			return nil, fmt.Errorf("NATS creds: %w", err)
		}
		opts = append(opts, nats.UserCredentials(a.Creds))
	}
	if a.Nkey != "" {
		o, err := nats.NkeyOptionFromSeed(a.Nkey)
		if err != nil {
			// nats.go's error names the file, never the seed.
			return nil, fmt.Errorf("NATS nkey seed %s: %w", a.Nkey, err)
		}
		opts = append(opts, o)
	}
	if a.CA != "" {
		if err := readable(a.CA); err != nil {
			return nil, fmt.Errorf("NATS CA: %w", err)
		}
		opts = append(opts, nats.RootCAs(a.CA))
	}
	if (a.Cert == "") != (a.Key == "") {
		return nil, errors.New("a NATS client certificate needs both its certificate and its key")
	}
	if a.Cert != "" {
		for _, f := range []string{a.Cert, a.Key} {
			if err := readable(f); err != nil {
				return nil, fmt.Errorf("NATS client certificate: %w", err)
			}
		}
		opts = append(opts, nats.ClientCert(a.Cert, a.Key))
	}
	return opts, nil
}

func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return f.Close()
}

// EmbeddedNkeyFile is where the embedded server's one user keeps its nkey seed: made once by
// EmbeddedUser and read by the process itself, `locks replay` and the nats CLI (--nkey).
func EmbeddedNkeyFile(dataDir string) string { return filepath.Join(dataDir, "nats-user.nk") }

// EmbeddedUser returns the public key of the embedded server's user, making its seed in
// EmbeddedNkeyFile (mode 0600) the first time, as the API token is kept in the data dir.
func EmbeddedUser(dataDir string) (string, error) { return nkeyUser(EmbeddedNkeyFile(dataDir)) }

// EmbeddedPartNkeyFile is where the embedded server's user for part keeps its nkey seed: a
// process running only that part connects with it (LOCKS_NATS_NKEY) and gets only that
// part's row of the permission matrix (PartPermissions).
func EmbeddedPartNkeyFile(dataDir, part string) string {
	return filepath.Join(dataDir, "nats-"+part+".nk")
}

// EmbeddedPartAuth is how a process running only part authenticates to the embedded server
// of data dir dir.
func EmbeddedPartAuth(dir, part string) Auth { return Auth{Nkey: EmbeddedPartNkeyFile(dir, part)} }

// embeddedPartUsers are the per-part users of the embedded server, their seeds made once in
// dataDir as the operator's is.
func embeddedPartUsers(dataDir string, partitions int) ([]*server.NkeyUser, error) {
	var users []*server.NkeyUser
	for _, part := range Parts {
		pub, err := nkeyUser(EmbeddedPartNkeyFile(dataDir, part))
		if err != nil {
			return nil, err
		}
		perms, err := PartPermissions(part, partitions)
		if err != nil {
			return nil, err
		}
		users = append(users, &server.NkeyUser{Nkey: pub, Permissions: perms.server()})
	}
	return users, nil
}

// nkeyUser returns the public key of the user whose seed is in path, making the seed (mode
// 0600) the first time.
func nkeyUser(path string) (string, error) {
	seed, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if seed, err = newUserSeed(path); err != nil {
			return "", fmt.Errorf("make the embedded NATS credential %s: %w", path, err)
		}
	} else if err != nil {
		return "", fmt.Errorf("read the embedded NATS credential: %w", err)
	}
	kp, err := nkeys.ParseDecoratedNKey(seed)
	if err != nil {
		return "", fmt.Errorf("the embedded NATS credential %s is not an nkey seed (delete it to make a new one): %w", path, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return "", fmt.Errorf("the embedded NATS credential %s is not a user nkey seed (delete it to make a new one)", path)
	}
	return pub, nil
}

// newUserSeed writes a fresh user seed to path without ever leaving it readable by others
// or half-written: a temporary file in the same directory, renamed into place.
func newUserSeed(path string) ([]byte, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".nats-user-*.nk")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Write(append(seed, '\n')); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	// Link, not rename: two processes starting at once on one data dir keep the first seed.
	if err := os.Link(f.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return os.ReadFile(path)
}

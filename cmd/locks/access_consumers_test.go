package main

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// natsUsersUnderTest connect as one of the matrix's users to a server enforcing it.
type natsUsersUnderTest func(t *testing.T, user string) (jetstream.JetStream, *violations)

// embeddedUsers is an embedded server (natsx.Embedded) and its per-part nkey users.
func embeddedUsers(t *testing.T) natsUsersUnderTest {
	dir := t.TempDir()
	ns, err := natsx.Embedded(dir, "127.0.0.1:0", natsx.Sync{Always: true}, 4, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return func(t *testing.T, user string) (jetstream.JetStream, *violations) {
		v := &violations{}
		auth := natsx.EmbeddedAuth(dir)
		opts := []nats.Option{nats.ErrorHandler(v.handler)}
		if user != "admin" {
			auth = natsx.EmbeddedPartAuth(dir, user)
			opts = append(opts, nats.CustomInboxPrefix(natsx.InboxPrefix(user)))
		}
		ao, err := auth.Options()
		if err != nil {
			t.Fatal(err)
		}
		return testenv.JetStream(t, ns.ClientURL(), "test-"+user, append(ao, opts...)...), v
	}
}

// Issue 25, item 2: a part's NATS user may not delete, pause, reset, unpin, step down,
// redefine, read or fetch from another part's consumer (here the notifier's EVENTS consumer
// of partition 0, which the api, history and state users can otherwise reach), may not list
// a stream's consumers, and may not subscribe to another part's inbox, where its replies and
// pushed messages arrive. Its owner may create and delete it, and the others may still read
// EVENTS with consumers of their own, so the refusals are the names' doing. On the embedded
// server's per-part users and on deploy/nats/accounts.conf, which the cluster's nodes load.
func TestPartsCannotTouchOthersConsumers(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]func(*testing.T) natsUsersUnderTest{
		"embedded": embeddedUsers,
		"accounts.conf": func(t *testing.T) natsUsersUnderTest {
			a := startAccessServer(t)
			return func(t *testing.T, user string) (jetstream.JetStream, *violations) { return a.connect(t, user) }
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			connect := setup(t)
			admin, _ := connect(t, "admin")
			if err := natsx.Declare(t.Context(), admin, natsx.StreamsConfig{Partitions: 4, LostAfter: time.Hour}); err != nil {
				t.Fatal(err)
			}
			const victim = "notifier-0"
			cfg := jetstream.ConsumerConfig{Durable: victim, FilterSubject: natsx.EventsPartitionFilter(0),
				AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second}
			owner, _ := connect(t, "notifier")
			if _, err := owner.CreateConsumer(t.Context(), natsx.EventsStream, cfg); err != nil {
				t.Fatalf("the notifier creating its own consumer: %v", err)
			}
			short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(t.Context(), time.Second) }

			for _, attacker := range []string{"api", "history", "state", "bridge"} {
				t.Run(attacker, func(t *testing.T) {
					t.Parallel()
					js, v := connect(t, attacker)
					attempts := map[string]func(context.Context) error{
						"delete": func(ctx context.Context) error { return js.DeleteConsumer(ctx, natsx.EventsStream, victim) },
						"pause": func(ctx context.Context) error {
							_, err := js.PauseConsumer(ctx, natsx.EventsStream, victim, time.Now().Add(time.Hour))
							return err
						},
						"reset": func(ctx context.Context) error {
							_, err := js.ResetConsumer(ctx, natsx.EventsStream, victim)
							return err
						},
						"redefine": func(ctx context.Context) error {
							c := cfg
							c.AckWait = time.Hour
							_, err := js.CreateOrUpdateConsumer(ctx, natsx.EventsStream, c)
							return err
						},
						"info": func(ctx context.Context) error {
							_, err := js.Consumer(ctx, natsx.EventsStream, victim)
							return err
						},
						"step down": func(ctx context.Context) error {
							_, err := js.Conn().RequestWithContext(ctx, "$JS.API.CONSUMER.LEADER.STEPDOWN."+natsx.EventsStream+"."+victim, nil)
							return err
						},
						"unpin": func(ctx context.Context) error {
							_, err := js.Conn().RequestWithContext(ctx, "$JS.API.CONSUMER.UNPIN."+natsx.EventsStream+"."+victim, []byte(`{"group":"g"}`))
							return err
						},
						"fetch": func(ctx context.Context) error {
							_, err := js.Conn().RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT."+natsx.EventsStream+"."+victim, []byte(`{"batch":1,"no_wait":true}`))
							return err
						},
						"list names": func(ctx context.Context) error {
							st, err := js.Stream(ctx, natsx.EventsStream)
							if err != nil {
								return err
							}
							l := st.ConsumerNames(ctx)
							for range l.Name() {
							}
							return l.Err()
						},
					}
					if attacker == "api" {
						delete(attempts, "info") // the api reads the projections' lag from their consumers
					}
					// Side by side: a refused request is answered by no one and waits out its
					// timeout.
					var wg sync.WaitGroup
					for what, try := range attempts {
						wg.Go(func() {
							ctx, cancel := short()
							defer cancel()
							if err := try(ctx); err == nil {
								t.Errorf("%s may %s the notifier's consumer", attacker, what)
							}
						})
					}
					wg.Wait()
					testenv.Eventually(t, 5*time.Second, "the server's permissions violation for the delete", func() bool {
						return v.about("$JS.API.CONSUMER.DELETE." + natsx.EventsStream + "." + victim)
					})
					// Another part's inbox: where its replies and pushed messages arrive.
					for _, inbox := range []string{natsx.InboxPrefix("notifier") + ".>", "_INBOX.>"} {
						if _, err := js.Conn().Subscribe(inbox, func(*nats.Msg) {}); err != nil {
							t.Fatal(err)
						}
						testenv.Eventually(t, 5*time.Second, attacker+" refused a subscription to "+inbox, func() bool { return v.about(inbox) })
					}
					if attacker == "bridge" {
						return // reads no EVENTS at all
					}
					// A consumer of its own on EVENTS: allowed.
					ctx, cancel := short()
					defer cancel()
					own, err := js.CreateConsumer(ctx, natsx.EventsStream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy,
						InactiveThreshold: time.Minute, MemoryStorage: true})
					if err != nil {
						t.Fatalf("%s reading EVENTS with a consumer of its own: %v", attacker, err)
					}
					if err := js.DeleteConsumer(ctx, natsx.EventsStream, own.CachedInfo().Name); err != nil {
						t.Fatalf("%s deleting its own consumer: %v", attacker, err)
					}
				})
			}
			t.Cleanup(func() {
				// After the attackers (parallel subtests end before the parent's cleanups).
				info, err := admin.Consumer(context.WithoutCancel(t.Context()), natsx.EventsStream, victim)
				if err != nil {
					t.Errorf("the notifier's consumer after the attempts: %v", err)
					return
				}
				if i := info.CachedInfo(); i.Paused || i.Config.AckWait != cfg.AckWait {
					t.Errorf("the notifier's consumer was changed: paused %v, ack wait %s", i.Paused, i.Config.AckWait)
				}
				if err := owner.DeleteConsumer(context.WithoutCancel(t.Context()), natsx.EventsStream, victim); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
					t.Errorf("the notifier deleting its own consumer: %v", err)
				}
			})
		})
	}
}

// Issue 25, items 2 and 6: a part's user writes (and deletes) registry keys and LOGS subjects
// of its own part only: not another part's, not a bare or "all" key (those belong to a user
// allowed everything). Its own are allowed, so the refusals are the prefixes' doing.
func TestPartsWriteOnlyTheirOwnRegistryKeys(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]func(*testing.T) natsUsersUnderTest{
		"embedded": embeddedUsers,
		"accounts.conf": func(t *testing.T) natsUsersUnderTest {
			a := startAccessServer(t)
			return func(t *testing.T, user string) (jetstream.JetStream, *violations) { return a.connect(t, user) }
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			connect := setup(t)
			admin, _ := connect(t, "admin")
			if err := natsx.Declare(t.Context(), admin, natsx.StreamsConfig{Partitions: 4, LostAfter: time.Hour}); err != nil {
				t.Fatal(err)
			}
			akv, err := admin.KeyValue(t.Context(), natsx.ProcessesBucket)
			if err != nil {
				t.Fatal(err)
			}
			victim := natsx.ProcessKey("notifier", "host-1-0badcafe")
			if _, err := akv.Put(t.Context(), victim, []byte(`{"id":"host-1-0badcafe","parts":["notifier"]}`)); err != nil {
				t.Fatal(err)
			}
			js, v := connect(t, "state")
			kv, err := js.KeyValue(t.Context(), natsx.ProcessesBucket)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if _, err := kv.Put(ctx, natsx.ProcessKey("state", "host-2-12345678"), []byte(`{}`)); err != nil {
				t.Fatalf("the state user writing its own part's key: %v", err)
			}
			if _, err := js.Publish(ctx, natsx.LogsSubject(natsx.ProcessKey("state", "host-2-12345678")), []byte(`{}`)); err != nil {
				t.Fatalf("the state user appending to its own LOGS subject: %v", err)
			}
			var wg sync.WaitGroup
			for what, try := range map[string]func(context.Context) error{
				"overwrite another part's key": func(ctx context.Context) error { _, err := kv.Put(ctx, victim, []byte(`{}`)); return err },
				"delete another part's key":    func(ctx context.Context) error { return kv.Delete(ctx, victim) },
				"write an all key": func(ctx context.Context) error {
					_, err := kv.Put(ctx, natsx.ProcessKey(natsx.ProcessAll, "host-3-1"), []byte(`{}`))
					return err
				},
				"write a bare key": func(ctx context.Context) error { _, err := kv.Put(ctx, "host-3-1", []byte(`{}`)); return err },
				"append to another part's LOGS subject": func(ctx context.Context) error {
					_, err := js.Publish(ctx, natsx.LogsSubject(victim), []byte(`{}`))
					return err
				},
			} {
				// Side by side, as in TestPartsCannotTouchOthersConsumers.
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(t.Context(), time.Second)
					defer cancel()
					if err := try(ctx); err == nil {
						t.Errorf("the state user may %s", what)
					}
				})
			}
			wg.Wait()
			testenv.Eventually(t, 5*time.Second, "the server's permissions violation", func() bool {
				return v.about("$KV." + natsx.ProcessesBucket + "." + victim)
			})
			e, err := akv.Get(t.Context(), victim)
			if err != nil || string(e.Value()) != `{"id":"host-1-0badcafe","parts":["notifier"]}` {
				t.Fatalf("the notifier's key after the attempts: %v %q", err, e.Value())
			}
		})
	}
}

package testenv

import (
	"bytes"
	"log/slog"
	"sync"
)

// LogBuffer is an io.Writer that goroutines may share: it captures a part's log (or a
// process's output) so that a test can search it afterwards, e.g. for a secret that must
// not be there.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// CaptureLogger is a debug-level text logger whose lines go to the LogBuffer it returns.
func CaptureLogger() (*slog.Logger, *LogBuffer) {
	b := &LogBuffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

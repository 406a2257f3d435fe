package notifier

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// BenchmarkDeliveries measures deliveries per second to a fast local receiver: 50 clients
// (one receiver behind them all) subscribed to 400 sensors, one event per sensor per
// iteration, so 20,000 deliveries per iteration, from the first EVENTS append to the last
// receipt. pg_cpu_us/delivery and go_cpu_us/delivery are as in BenchmarkOneClient.
func BenchmarkDeliveries(b *testing.B) {
	const clients, sensors = 50, 400
	e := newEnv(b, time.Second)
	var got atomic.Int64
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(rc.Close)
	e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret)
		SELECT 'c' || i, 'c' || i, $1, 'whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=' FROM generate_series(1, $2::int) i`, rc.URL, clients)
	e.exec(`INSERT INTO sensors (id, address) SELECT 's' || i, 'address ' || i FROM generate_series(1, $1::int) i`, sensors)
	e.exec(`INSERT INTO subscriptions (client_id, sensor_id) SELECT c.id, s.id FROM clients c, sensors s`)
	e.cfg.WebhookTimeout = 5 * time.Second
	e.start()
	b.ResetTimer()
	cpu0, ru0 := backendCPU(b, e.pool), testenv.SelfCPU()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		evs := make([]event.Event, 0, sensors)
		for s := 1; s <= sensors; s++ {
			evs = append(evs, testEvent(fmt.Sprintf("s%d", s), int64(i+1), uint8((i+1)%2)))
		}
		e.publish(evs...)
		want := int64((i + 1) * clients * sensors)
		testenv.Eventually(b, 5*time.Minute, "deliveries", func() bool { return got.Load() >= want })
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(got.Load())/el.Seconds(), "deliveries/s")
	// As in BenchmarkOneClient: steadier than deliveries/s on a shared machine.
	if cpu1 := backendCPU(b, e.pool); cpu0 != nil && cpu1 != nil {
		var sum time.Duration
		for pid, t := range cpu1 {
			sum += t - cpu0[pid]
		}
		b.ReportMetric(float64(sum.Microseconds())/float64(got.Load()), "pg_cpu_us/delivery")
	}
	b.ReportMetric(float64((testenv.SelfCPU()-ru0).Microseconds())/float64(got.Load()), "go_cpu_us/delivery")
	var ingest, done float64
	if err := e.pool.QueryRow(b.Context(), `SELECT extract(epoch FROM max(created_at) - min(created_at)),
		extract(epoch FROM max(updated_at) - min(created_at)) FROM notifier_deliveries`).Scan(&ingest, &done); err == nil {
		b.Logf("rows created over %.2fs, all finished %.2fs after the first was created", ingest, done)
	}
}

// BenchmarkLatency measures p50/p99 from EVENTS append to receipt at about 1,000 events/s
// for 5 s, 100 clients each subscribed to its own 10 sensors; "hanging10pct" makes 10 of the
// clients' receivers hang (attempt timeout 2 s) and measures the healthy ones.
func BenchmarkLatency(b *testing.B) {
	for _, tc := range []struct {
		name    string
		hanging int
	}{{"healthy", 0}, {"hanging10pct", 10}} {
		b.Run(tc.name, func(b *testing.B) {
			const clients, perClient, rate, seconds = 100, 10, 1000, 5
			e := newEnv(b, time.Second, 2*time.Second)
			e.cfg.WebhookTimeout = 2 * time.Second
			var mu sync.Mutex
			recv := map[string]time.Time{}
			fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				now := time.Now()
				mu.Lock()
				recv[r.Header.Get("webhook-id")] = now
				mu.Unlock()
				w.WriteHeader(http.StatusOK)
			}))
			b.Cleanup(fast.Close)
			hang := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				// Reading the body lets the server notice the client hanging up.
				_, _ = io.Copy(io.Discard, r.Body)
				<-r.Context().Done()
			}))
			b.Cleanup(hang.Close)
			for c := 0; c < clients; c++ {
				u := fast.URL
				if c < tc.hanging {
					u = hang.URL
				}
				e.client(fmt.Sprintf("c%d", c), u)
			}
			e.exec(`INSERT INTO sensors (id, address) SELECT 's' || i, 'address' FROM generate_series(0, $1::int - 1) i`, clients*perClient)
			e.exec(`INSERT INTO subscriptions (client_id, sensor_id) SELECT 'c' || (i / $2::int), 's' || i FROM generate_series(0, $1::int - 1) i`,
				clients*perClient, perClient)
			e.start()
			b.ResetTimer()
			for it := 0; it < b.N; it++ {
				sent := map[string]time.Time{}
				rev := map[int]int64{}
				tick := time.NewTicker(10 * time.Millisecond)
				n := 0
				for range tick.C {
					batch := make([]event.Event, 0, rate/100)
					for k := 0; k < rate/100; k++ {
						s := n % (clients * perClient)
						rev[s]++
						batch = append(batch, testEvent(fmt.Sprintf("s%d", s), rev[s]+int64(it)*1000, uint8(rev[s]%2)))
						n++
					}
					t0 := time.Now()
					e.publish(batch...)
					for _, ev := range batch {
						if s := sensorIndex(ev.SensorID); s/perClient >= tc.hanging {
							sent[ev.ID] = t0
						}
					}
					if n >= rate*seconds {
						break
					}
				}
				tick.Stop()
				testenv.Eventually(b, time.Minute, "healthy deliveries", func() bool {
					mu.Lock()
					defer mu.Unlock()
					for id := range sent {
						if _, ok := recv[id]; !ok {
							return false
						}
					}
					return true
				})
				var lat []time.Duration
				mu.Lock()
				for id, t0 := range sent {
					lat = append(lat, recv[id].Sub(t0))
				}
				mu.Unlock()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
				b.ReportMetric(float64(len(lat)), "healthy_events")
			}
		})
	}
}

func sensorIndex(id string) int {
	var i int
	_, _ = fmt.Sscanf(id, "s%d", &i)
	return i
}

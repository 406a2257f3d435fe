package bridge

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Readings whose ts is far from the receive time are counted by direction, and still recorded
// with the ts the sensor sent: a wrong clock is reported, never a reason to drop a reading.
func TestBridgeClockSkew(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	now := time.Now().UTC()
	tss := []struct {
		ts    string
		ahead bool
		skew  bool
	}{
		{ts: ""}, // absent: the receive time
		{ts: now.Add(-time.Minute).Format(time.RFC3339Nano)},                         // a little late: within 5m
		{ts: now.Add(2 * time.Minute).Format(time.RFC3339Nano)},                      // a little fast: within 5m
		{ts: "1970-01-01T00:00:07Z", skew: true},                                     // after a battery change
		{ts: now.Add(-time.Hour).Format(time.RFC3339Nano), skew: true},               // an hour behind
		{ts: now.AddDate(5, 0, 0).Format(time.RFC3339Nano), skew: true, ahead: true}, // years ahead
	}
	var msgs []amqp.Publishing
	for i, c := range tss {
		body := fmt.Sprintf(`{"sensor_id":"clock%d","data":1}`, i)
		if c.ts != "" {
			body = fmt.Sprintf(`{"sensor_id":"clock%d","data":1,"ts":%q}`, i, c.ts)
		}
		msgs = append(msgs, amqp.Publishing{Body: []byte(body)})
	}
	e.publish(t, msgs)
	stop := e.start(t, Config{})
	testenv.Eventually(t, time.Minute, "all readings appended", func() bool { return e.streamMsgs(t) == uint64(len(tss)) })
	e.quiesce(t)
	stop()
	if got, want := metricValue(e.bridge.skew.behind), 2.0; got != want {
		t.Errorf(`locks_bridge_clock_skew_total{direction="behind"} = %v, want %v`, got, want)
	}
	if got, want := metricValue(e.bridge.skew.ahead), 1.0; got != want {
		t.Errorf(`locks_bridge_clock_skew_total{direction="ahead"} = %v, want %v`, got, want)
	}
	logs, _ := e.readings(t)
	for _, l := range logs {
		var i int
		if _, err := fmt.Sscanf(l.SensorID, "clock%d", &i); err != nil {
			t.Fatal(err)
		}
		if c := tss[i]; c.ts != "" {
			want, _ := time.Parse(time.RFC3339Nano, c.ts)
			if !l.Time.Equal(want) {
				t.Errorf("%s stored with ts %s, want the sensor's %s", l.SensorID, l.Time, want)
			}
		}
	}
}

package bridge

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

var base = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// reading i: sensor s<i mod sensors>, data i mod 2, ts base + i ms; every other one carries a
// message_id, the rest rely on the digest.
func reading(i, sensors int) amqp.Publishing {
	p := amqp.Publishing{
		ContentType: "application/json",
		Body: fmt.Appendf(nil, `{"sensor_id":"s%d","data":%d,"ts":%q}`, i%sensors, i%2,
			base.Add(time.Duration(i)*time.Millisecond).Format(time.RFC3339Nano)),
	}
	if i%2 == 0 {
		p.MessageId = fmt.Sprintf("m-%d", i)
	}
	return p
}

// checkExactlyOnce asserts READINGS holds exactly the readings want (indexes into reading()).
func checkExactlyOnce(t *testing.T, e *env, want []int, sensors int) {
	t.Helper()
	logs, subjects := e.readings(t)
	if len(logs) != len(want) {
		t.Fatalf("READINGS holds %d messages, want %d", len(logs), len(want))
	}
	seen := map[int]bool{}
	lastOf := map[string]int{} // per-sensor order (invariant 4): each sensor's readings in publish order
	for k, l := range logs {
		i := int(l.Time.Sub(base) / time.Millisecond)
		if seen[i] {
			t.Fatalf("reading %d recorded twice", i)
		}
		seen[i] = true
		if prev, ok := lastOf[l.SensorID]; ok && prev > i {
			t.Fatalf("sensor %s: reading %d recorded after reading %d", l.SensorID, i, prev)
		}
		lastOf[l.SensorID] = i
		if l.SensorID != fmt.Sprintf("s%d", i%sensors) || int(l.Data) != i%2 || l.Kind != "reading" || l.V != 1 {
			t.Fatalf("reading %d recorded as %+v", i, l)
		}
		if !strings.HasSuffix(subjects[k], "."+l.SensorID) || !strings.HasPrefix(subjects[k], "readings.") {
			t.Fatalf("reading %d stored under subject %s", i, subjects[k])
		}
		if i%2 == 0 && l.MessageID != fmt.Sprintf("m-%d", i) || i%2 == 1 && !strings.HasPrefix(l.MessageID, "sha256:") {
			t.Fatalf("reading %d has message id %q", i, l.MessageID)
		}
		if l.ReceivedTime.IsZero() || time.Since(l.ReceivedTime) > 10*time.Minute {
			t.Fatalf("reading %d has received time %v", i, l.ReceivedTime)
		}
	}
	for _, i := range want {
		if !seen[i] {
			t.Fatalf("reading %d is missing", i)
		}
	}
}

func TestBridgeOneInvalidInTen(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	invalid := []struct {
		body, header, reason string
	}{
		{`{"sensor_id":"s1","data":2}`, "data: must be the JSON number 0 or 1", ReasonData},
		{`{"sensor_id":"s1","data":"1"}`, "data: must be the JSON number 0 or 1", ReasonData},
		{`{"sensor_id":"0123456789aBcDeFx","data":1}`, "sensor_id: must be 1-16 ASCII letters or digits", ReasonSensorID},
		{`{"sensor_id":"s1","data":1,"ts":"noon"}`, "ts: must be an RFC 3339 time string", ReasonTS},
		{`not json`, "body: must be a JSON object", ReasonNotJSON},
		{`{"sensor_id":"s1","data":1,"pad":"` + strings.Repeat("x", MaxBodySize) + `"}`, "body: larger than 4 KiB", ReasonTooBig},
	}
	const n, sensors = 1000, 37
	var msgs []amqp.Publishing
	var want []int
	wantHeader := map[string]string{} // invalid body → header
	wantReasons := map[string]float64{}
	for i := range n {
		if i%10 == 9 {
			bad := invalid[(i/10)%len(invalid)]
			body := bad.body + strings.Repeat(" ", i/10) // distinct bodies
			if bad.reason == ReasonNotJSON {
				body = fmt.Sprintf("not json %d", i)
			}
			msgs = append(msgs, amqp.Publishing{Body: []byte(body), Headers: amqp.Table{"sender": "test"}})
			wantHeader[body] = bad.header
			wantReasons[bad.reason]++
			continue
		}
		msgs = append(msgs, reading(i, sensors))
		want = append(want, i)
	}
	e.publish(t, msgs)
	stop := e.start(t, Config{Prefetch: 50})
	testenv.Eventually(t, time.Minute, "all messages handled", func() bool {
		return e.streamMsgs(t) == uint64(len(want)) && e.queueReady(t, e.queue+".invalid") == n/10
	})
	e.quiesce(t)
	stop()
	if got := e.queueReady(t, e.queue); got != 0 {
		t.Fatalf("%d messages left in %s after the bridge stopped: not all were acked", got, e.queue)
	}
	checkExactlyOnce(t, e, want, sensors)

	for range n / 10 {
		d, ok, err := e.ch.Get(e.queue+".invalid", true)
		if err != nil || !ok {
			t.Fatalf("get from invalid queue: %v %v", ok, err)
		}
		h, ok := wantHeader[string(d.Body)]
		if !ok && len(d.Body) == InvalidPrefix { // a too-big body, cut
			for body, hh := range wantHeader {
				if len(body) > InvalidPrefix && body[:InvalidPrefix] == string(d.Body) && d.Headers[SizeHeader] == int64(len(body)) {
					h, ok, d.Body = hh, true, []byte(body)
					break
				}
			}
		}
		if !ok {
			t.Fatalf("unexpected body in invalid queue: %.80q", d.Body)
		}
		delete(wantHeader, string(d.Body))
		if got := d.Headers[ErrorHeader]; got != h {
			t.Fatalf("%s = %q, want %q (body %.60q)", ErrorHeader, got, h, d.Body)
		}
		if d.Headers["sender"] != "test" || d.DeliveryMode != amqp.Persistent {
			t.Fatalf("original headers or persistence lost: %v mode %d", d.Headers, d.DeliveryMode)
		}
	}
	if len(wantHeader) != 0 {
		t.Fatalf("%d invalid messages missing from the invalid queue", len(wantHeader))
	}
	if got := metricValue(e.bridge.m.accepted); got != float64(len(want)) {
		t.Fatalf("accepted metric %v, want %d", got, len(want))
	}
	for r, c := range wantReasons {
		if got := metricValue(e.bridge.m.invalid.WithLabelValues(r)); got != c {
			t.Fatalf("invalid{reason=%s} = %v, want %v", r, got, c)
		}
	}
}

// TestBridgeRedeliveryAfterCrash kills a bridge between JetStream's ack and the AMQP ack;
// RabbitMQ redelivers what was not acked, and a second bridge records none of it twice.
func TestBridgeRedeliveryAfterCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	const n, sensors, crashAt = 600, 11, 250
	var msgs []amqp.Publishing
	var want []int
	for i := range n {
		msgs = append(msgs, reading(i, sensors))
		want = append(want, i)
	}
	e.publish(t, msgs)

	afterCrash := e.crashChild(t, crashAt)
	t.Logf("READINGS holds %d of %d after the crash", afterCrash, n)

	stop := e.start(t, Config{Prefetch: 100})
	testenv.Eventually(t, time.Minute, "all readings in READINGS", func() bool { return e.streamMsgs(t) >= uint64(n) })
	e.quiesce(t)
	stop()
	if got := e.queueReady(t, e.queue); got != 0 {
		t.Fatalf("%d messages left in the queue", got)
	}
	checkExactlyOnce(t, e, want, sensors)
	// The message the child died on (and those it had not acked) came back and were
	// recognised as recorded.
	if d := metricValue(e.bridge.m.duplicates); d < 1 {
		t.Fatalf("duplicates metric %v: the redelivered messages were not seen as duplicates", d)
	}
	t.Logf("duplicates recognised after the crash: %v", metricValue(e.bridge.m.duplicates))
}

// restartReadings is the length of the restart tests' runs: 20,000, or
// LOCKS_BRIDGE_RESTART_READINGS (e.g. 100000 for the full run).
func restartReadings(t *testing.T) int {
	t.Helper()
	v := os.Getenv("LOCKS_BRIDGE_RESTART_READINGS")
	if v == "" {
		return 20000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 100 {
		t.Fatalf("LOCKS_BRIDGE_RESTART_READINGS=%q: want a number >= 100", v)
	}
	return n
}

// TestBridgeNATSRestart restarts NATS in the middle of 20,000 readings.
func TestBridgeNATSRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	n, sensors := restartReadings(t), 1000
	var msgs []amqp.Publishing
	var want []int
	for i := range n {
		msgs = append(msgs, reading(i, sensors))
		want = append(want, i)
	}
	e.publish(t, msgs)
	stop := e.start(t, Config{PublishTimeout: 2 * time.Second})
	testenv.Eventually(t, time.Minute, "a quarter appended", func() bool { return e.streamMsgs(t) >= uint64(n/4) })
	before := e.streamMsgs(t)
	e.nats.Restart(500 * time.Millisecond)
	t.Logf("NATS restarted with %d of %d readings appended", before, n)
	if before >= uint64(n) {
		t.Fatal("the run ended before the restart")
	}
	testenv.Eventually(t, 2*time.Minute, "all readings appended", func() bool { return e.streamMsgs(t) >= uint64(n) })
	e.quiesce(t)
	stop()
	if got := e.queueReady(t, e.queue); got != 0 {
		t.Fatalf("%d messages left in the queue", got)
	}
	checkExactlyOnce(t, e, want, sensors)
	t.Logf("retries %v, duplicates %v", metricValue(e.bridge.m.retries), metricValue(e.bridge.m.duplicates))
}

// TestBridgeRabbitMQRestart kills and restarts a private RabbitMQ node in the middle of
// 20,000 readings.
func TestBridgeRabbitMQRestart(t *testing.T) {
	booted := testenv.BootPrivateRabbitMQ(t)
	t.Parallel()
	node := booted()
	e := newEnv(t, node.URL)
	n, sensors := restartReadings(t), 1000
	var msgs []amqp.Publishing
	var want []int
	for i := range n {
		msgs = append(msgs, reading(i, sensors))
		want = append(want, i)
	}
	e.publish(t, msgs)
	// Dials of the node while it reboots are refused at once: a short backoff costs nothing
	// and reconnects within a fraction of a second of the node's return.
	stop := e.start(t, Config{ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	testenv.Eventually(t, time.Minute, "a quarter appended", func() bool { return e.streamMsgs(t) >= uint64(n/4) })
	before := e.streamMsgs(t)
	node.Restart()
	t.Logf("RabbitMQ restarted with %d of %d readings appended", before, n)
	if before >= uint64(n) {
		t.Fatal("the run ended before the restart")
	}
	e.connectAMQP(t)
	testenv.Eventually(t, 2*time.Minute, "all readings appended", func() bool { return e.streamMsgs(t) >= uint64(n) })
	e.quiesce(t)
	stop()
	if got := e.queueReady(t, e.queue); got != 0 {
		t.Fatalf("%d messages left in the queue", got)
	}
	checkExactlyOnce(t, e, want, sensors)
	if c := metricValue(e.bridge.m.connects); c < 2 {
		t.Fatalf("connects metric %v: the bridge did not reconnect", c)
	}
	t.Logf("connects %v, duplicates %v", metricValue(e.bridge.m.connects), metricValue(e.bridge.m.duplicates))
}

// quiesce waits until RabbitMQ has nothing ready for the bridge and the bridge has had
// nothing in flight and accepted nothing new for half a second: every message is handled.
func (e *env) quiesce(t *testing.T) {
	t.Helper()
	var last float64 = -1
	var since time.Time
	testenv.Eventually(t, time.Minute, "bridge idle with the queue empty", func() bool {
		acc := metricValue(e.bridge.m.accepted)
		if e.queueReady(t, e.queue) != 0 || metricValue(e.bridge.m.inFlight) != 0 || acc != last {
			last, since = acc, time.Now()
			return false
		}
		return time.Since(since) > 500*time.Millisecond
	})
}

// metricValue reads a counter or gauge.
func metricValue(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// TestBridgeInvalidQueueDeleted: an invalid message whose invalid queue vanished under the
// bridge comes back (mandatory publish, returned) instead of being acked and lost.
func TestBridgeInvalidQueueDeleted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.start(t, Config{})
	testenv.Eventually(t, 30*time.Second, "bridge connected", func() bool { return metricValue(e.bridge.m.connects) == 1 })
	if _, err := e.ch.QueueDelete(e.queue+".invalid", false, false, false); err != nil {
		t.Fatal(err)
	}
	e.publish(t, []amqp.Publishing{{Body: []byte(`{"sensor_id":"s1","data":7}`)}, reading(1, 1)})
	testenv.Eventually(t, 30*time.Second, "invalid message in the redeclared invalid queue", func() bool {
		q, err := e.ch.QueueDeclarePassive(e.queue+".invalid", true, false, false, false, nil)
		if err != nil { // a failed passive declare closes the channel: open another
			e.ch, _ = e.ch2(t)
			return false
		}
		return q.Messages == 1
	})
	e.quiesce(t)
	if c := metricValue(e.bridge.m.connects); c < 2 {
		t.Fatalf("connects %v: the session should have failed on the returned message", c)
	}
	d, ok, err := e.ch.Get(e.queue+".invalid", true)
	if err != nil || !ok || d.Headers[ErrorHeader] != "data: must be the JSON number 0 or 1" {
		t.Fatalf("invalid queue: %v %v %v", ok, err, d.Headers)
	}
	if n := e.streamMsgs(t); n != 1 {
		t.Fatalf("READINGS holds %d, want 1", n)
	}
}

// TestBridgeQuorumQueue: a readings queue an operator created with arguments of their own
// (here a quorum queue) is used as it is.
func TestBridgeQuorumQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	if _, err := e.ch.QueueDelete(e.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ch.QueueDeclare(e.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	const n, sensors = 200, 7
	var msgs []amqp.Publishing
	var want []int
	for i := range n {
		msgs = append(msgs, reading(i, sensors))
		want = append(want, i)
	}
	e.publish(t, msgs)
	stop := e.start(t, Config{})
	testenv.Eventually(t, 30*time.Second, "all readings appended", func() bool { return e.streamMsgs(t) >= n })
	e.quiesce(t)
	stop()
	checkExactlyOnce(t, e, want, sensors)
	if c := metricValue(e.bridge.m.connects); c != 1 {
		t.Fatalf("connects %v, want 1", c)
	}
}

// crashChild runs a bridge in a child process on e's queue until it dies at its crashAt-th
// CrashAfterPublish: right after JetStream's ack of that append, before its AMQP ack, so at
// least crashAt readings are stored and the last of them is unacked. It returns how many
// READINGS holds then.
func (e *env) crashChild(t *testing.T, crashAt int) uint64 {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childNATSEnv+"="+e.nats.URL, childAMQPEnv+"="+e.amqp,
		childQueueEnv+"="+e.queue, childPGEnv+"="+e.pgURL, fmt.Sprintf("%s=%s:%d", crashpoint.Env, CrashAfterPublish, crashAt))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != crashpoint.ExitCode {
		t.Fatalf("child bridge: %v, want exit %d\n%s", err, crashpoint.ExitCode, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the crashed child's output:\n%s", out)
		}
	})
	n := e.streamMsgs(t)
	if n < uint64(crashAt) {
		t.Fatalf("READINGS holds %d after the crash, want at least %d", n, crashAt)
	}
	return n
}

// Issue 25, item 10: a message_id with spaces, CR/LF or other control characters would name
// the same reading as another after nats.go trims the Nats-Msg-Id header ("a", " a", "a\r\n"),
// or break the header: each such message goes to the invalid queue with the reason, and the
// plain one is recorded.
func TestBridgeRefusesBadMessageIDs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	bad := []string{" m1", "m1 ", "m1\r\n", "m\x001", "m\t1", "m\u202e1", strings.Repeat("m", MaxMessageIDLen+1)}
	msgs := []amqp.Publishing{{Body: []byte(`{"sensor_id":"s1","data":1}`), MessageId: "m1"}}
	for i, id := range bad {
		msgs = append(msgs, amqp.Publishing{Body: []byte(fmt.Sprintf(`{"sensor_id":"s1","data":%d}`, i%2)), MessageId: id})
	}
	e.publish(t, msgs)
	stop := e.start(t, Config{Prefetch: 50})
	testenv.Eventually(t, time.Minute, "all messages handled", func() bool {
		return e.streamMsgs(t) == 1 && e.queueReady(t, e.queue+".invalid") == len(bad)
	})
	e.quiesce(t)
	stop()
	for range bad {
		d, ok, err := e.ch.Get(e.queue+".invalid", true)
		if err != nil || !ok {
			t.Fatalf("get from invalid queue: %v %v", ok, err)
		}
		if h, _ := d.Headers[ErrorHeader].(string); !strings.HasPrefix(h, "message_id:") {
			t.Fatalf("%s = %q for message_id %q, want the message_id named", ErrorHeader, h, d.MessageId)
		}
	}
	if got := metricValue(e.bridge.m.invalid.WithLabelValues(ReasonMessageID)); got != float64(len(bad)) {
		t.Fatalf("invalid{reason=message_id} = %v, want %d", got, len(bad))
	}
}

package bridge

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// An append whose ack is lost with its NATS connection (the node the bridge was connected to
// dies) is retried as soon as the connection is lost, not after PublishTimeout: readings do
// not stand still behind it. Retried with its Nats-Msg-Id, it is recorded once.
func TestAppendOfALostConnectionRetriedAtOnce(t *testing.T) {
	t.Parallel()
	for _, atomic := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "atomic"}[atomic], func(t *testing.T) {
			t.Parallel()
			e := newEnvAppending(t, "", atomic)
			proxy := testenv.NewNATSProxy(t, e.nats.URL)
			e.js = testenv.JetStream(t, proxy.URL, "bridge")
			e.start(t, Config{PublishTimeout: time.Minute})
			e.publish(t, []amqp.Publishing{reading(0, 3)})
			testenv.Eventually(t, 10*time.Second, "the first reading accepted", func() bool { return metricValue(e.bridge.m.accepted) == 1 })

			proxy.Hold(true) // the append is stored; its ack is lost
			e.publish(t, []amqp.Publishing{reading(1, 3)})
			testenv.Eventually(t, 10*time.Second, "the second reading stored", func() bool { return e.streamMsgs(t) == 2 })
			time.Sleep(200 * time.Millisecond)
			if metricValue(e.bridge.m.accepted) != 1 {
				t.Fatal("the reading was accepted without its ack: the test shows nothing")
			}
			cut := time.Now()
			proxy.Cut()
			proxy.Hold(false)
			// Well within PublishTimeout (a minute): a bridge that waits for the ack fails here.
			testenv.Eventually(t, 10*time.Second, "the second reading accepted", func() bool { return metricValue(e.bridge.m.accepted) == 2 })
			t.Logf("accepted %s after the connection was lost", time.Since(cut).Round(time.Millisecond))
			checkExactlyOnce(t, e, []int{0, 1}, 3)
		})
	}
}

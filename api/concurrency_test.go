package api

import (
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// Conditional changes are compare-and-set: of many updates racing with the same etag, one
// wins and the others get 412; of many creates of one id, one wins and the others get 409;
// subscribing at once from many calls makes one subscription.
func TestConcurrentChanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	const n = 12
	race := func(call func(i int) error) map[codes.Code]int {
		var mu sync.Mutex
		got := map[codes.Code]int{}
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				c := status.Code(call(i))
				mu.Lock()
				got[c]++
				mu.Unlock()
			})
		}
		wg.Wait()
		return got
	}

	got := race(func(int) error {
		_, err := e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "Race1", Address: "x"}})
		return err
	})
	if got[codes.OK] != 1 || got[codes.AlreadyExists] != n-1 {
		t.Fatalf("creates: %v", got)
	}

	s, err := e.sensors.GetSensor(ctx, &locksv1.GetSensorRequest{Id: "Race1"})
	if err != nil {
		t.Fatal(err)
	}
	got = race(func(i int) error {
		_, err := e.sensors.UpdateSensor(ctx, &locksv1.UpdateSensorRequest{Id: "Race1",
			Sensor:     &locksv1.Sensor{Address: "writer " + string(rune('a'+i)), Etag: s.GetSensor().GetEtag()},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"address"}}})
		return err
	})
	if got[codes.OK] != 1 || got[codes.FailedPrecondition] != n-1 {
		t.Fatalf("updates with one etag: %v", got)
	}

	c, err := e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{Client: &locksv1.Client{Name: "c", WebhookUrl: "https://203.0.113.5/"}})
	if err != nil {
		t.Fatal(err)
	}
	got = race(func(int) error {
		_, err := e.subs.CreateSubscription(ctx, &locksv1.CreateSubscriptionRequest{SensorId: "Race1", ClientId: c.GetClient().GetId()})
		return err
	})
	if got[codes.OK] != n || e.count(`SELECT count(*) FROM subscriptions`) != 1 {
		t.Fatalf("subscribes: %v, %d rows", got, e.count(`SELECT count(*) FROM subscriptions`))
	}
	got = race(func(int) error {
		_, err := e.clients.RotateClientSecret(ctx, &locksv1.RotateClientSecretRequest{Id: c.GetClient().GetId(), Etag: c.GetClient().GetEtag()})
		return err
	})
	if got[codes.OK] != 1 || got[codes.FailedPrecondition] != n-1 {
		t.Fatalf("rotations with one etag: %v", got)
	}
}

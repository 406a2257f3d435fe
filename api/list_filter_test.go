package api

import (
	"fmt"
	"slices"
	"testing"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// A filtered list pages through exactly the registered sensors whose state matches, in id
// order: not a sensor without state, not a state without a registered sensor.
func TestListSensorsFilterPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	if _, err := e.sensors.BatchCreateSensors(ctx, &locksv1.BatchCreateSensorsRequest{Requests: sensorReqs("f", 40)}); err != nil {
		t.Fatal(err)
	}
	var lost, lostClosed []string
	for i := range 36 { // f36…f39 have no state
		id := fmt.Sprintf("f%d", i)
		conn := "online"
		if i%3 == 0 {
			conn = "lost"
			lost = append(lost, id)
			if i%2 == 1 {
				lostClosed = append(lostClosed, id)
			}
		}
		e.setState(id, i%2, conn, 1)
	}
	e.setState("unregistered1", 1, "lost", 1)
	slices.Sort(lost)
	slices.Sort(lostClosed)
	one := int32(1)
	for _, tc := range []struct {
		name string
		req  *locksv1.ListSensorsRequest
		want []string
	}{
		{"lost", &locksv1.ListSensorsRequest{Connection: locksv1.Connection_CONNECTION_LOST}, lost},
		{"lost and closed", &locksv1.ListSensorsRequest{Connection: locksv1.Connection_CONNECTION_LOST, Data: &one}, lostClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			req := tc.req
			req.PageSize = 4
			for {
				page, err := e.sensors.ListSensors(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range page.GetSensors() {
					got = append(got, s.GetId())
				}
				if page.GetNextPageToken() == "" {
					break
				}
				req.PageToken = page.GetNextPageToken()
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("listed %v, want %v", got, tc.want)
			}
		})
	}
}

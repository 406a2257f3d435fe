package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
)

// BatchSize is the most sensors or subscriptions one batchCreate call of the admin API takes.
const BatchSize = 1000

// Registrar registers a fleet through the admin REST API's batch calls
// (`POST /v1/sensors:batchCreate`, `POST /v1/clients/{id}/sensors:batchCreate`): a thousand
// sensors a call, a few calls at once.
type Registrar struct {
	APIURL, Token string
	// Parallel calls at once; 0 means 4.
	Parallel int
	// HTTP is the client to call with; nil means one with a 2-minute timeout.
	HTTP *http.Client
}

// Registered is what Fleet did.
type Registered struct {
	Sensors    int // sensors of the fleet
	Created    int // of which this call registered (the others were already)
	Subscribed int // subscriptions made or confirmed
	Took       time.Duration
}

// parallel is Parallel or its default.
func (r Registrar) parallel() int {
	if r.Parallel <= 0 {
		return 4
	}
	return r.Parallel
}

// call posts in as JSON to path and decodes the answer into out (nil: ignored).
func (r Registrar) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(r.APIURL, "/")+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+r.Token)
	req.Header.Set("Content-Type", "application/json")
	hc := r.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 2 * time.Minute}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// CreateClient creates a client with the webhook URL and returns its id and signing secret.
func (r Registrar) CreateClient(ctx context.Context, name, webhookURL string) (id, secret string, err error) {
	var c struct {
		ID            string `json:"id"`
		SigningSecret string `json:"signing_secret"`
	}
	if err := r.call(ctx, http.MethodPost, "/v1/clients", map[string]string{"name": name, "webhook_url": webhookURL}, &c); err != nil {
		return "", "", fmt.Errorf("loadgen: create client: %w", err)
	}
	return c.ID, c.SigningSecret, nil
}

// Fleet registers sensors <prefix><from> … <prefix><from+n-1> (address "loadgen <id>"; those
// registered already are left as they are) and, if client is not empty, subscribes the client
// to each. Batches go Parallel at a time; each is the sensors' call, then the subscriptions'.
func (r Registrar) Fleet(ctx context.Context, prefix string, from, n int, client string) (Registered, error) {
	return r.batches(ctx, prefix, from, n, true, client)
}

// Subscribe subscribes client to the registered sensors <prefix><from> … <prefix><from+n-1>.
func (r Registrar) Subscribe(ctx context.Context, client, prefix string, from, n int) (Registered, error) {
	return r.batches(ctx, prefix, from, n, false, client)
}

func (r Registrar) batches(ctx context.Context, prefix string, from, n int, register bool, client string) (Registered, error) {
	start := time.Now()
	type sensorItem struct {
		Sensor struct {
			ID      string `json:"id"`
			Address string `json:"address"`
		} `json:"sensor"`
	}
	type subItem struct {
		SensorID string `json:"sensor_id"`
	}
	batches := (n + BatchSize - 1) / BatchSize
	created := make([]int, batches)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.parallel())
	for b := range batches {
		lo, hi := from+b*BatchSize, from+min((b+1)*BatchSize, n)
		g.Go(func() error {
			items := make([]sensorItem, 0, hi-lo)
			subs := make([]subItem, 0, hi-lo)
			for i := lo; i < hi; i++ {
				var it sensorItem
				it.Sensor.ID = SensorID(prefix, i)
				it.Sensor.Address = "loadgen " + it.Sensor.ID
				items = append(items, it)
				subs = append(subs, subItem{it.Sensor.ID})
			}
			span := items[0].Sensor.ID + "…" + items[len(items)-1].Sensor.ID
			if register {
				var res struct {
					Created int `json:"created"`
				}
				if err := r.call(gctx, http.MethodPost, "/v1/sensors:batchCreate",
					map[string]any{"requests": items, "skip_existing": true}, &res); err != nil {
					return fmt.Errorf("loadgen: register sensors %s: %w", span, err)
				}
				created[b] = res.Created
			}
			if client == "" {
				return nil
			}
			if err := r.call(gctx, http.MethodPost, "/v1/clients/"+client+"/sensors:batchCreate",
				map[string]any{"requests": subs}, nil); err != nil {
				return fmt.Errorf("loadgen: subscribe to sensors %s: %w", span, err)
			}
			return nil
		})
	}
	err := g.Wait()
	out := Registered{Sensors: n, Took: time.Since(start)}
	for _, c := range created {
		out.Created += c
	}
	if client != "" && err == nil {
		out.Subscribed = n
	}
	return out, err
}

// SubscribeIDs subscribes client to the registered sensors ids, BatchSize a call, Parallel
// calls at once: a client whose sensors are not one contiguous range of a fleet.
func (r Registrar) SubscribeIDs(ctx context.Context, client string, ids []string) error {
	type subItem struct {
		SensorID string `json:"sensor_id"`
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.parallel())
	for lo := 0; lo < len(ids); lo += BatchSize {
		chunk := ids[lo:min(lo+BatchSize, len(ids))]
		g.Go(func() error {
			subs := make([]subItem, len(chunk))
			for i, id := range chunk {
				subs[i] = subItem{id}
			}
			if err := r.call(gctx, http.MethodPost, "/v1/clients/"+client+"/sensors:batchCreate",
				map[string]any{"requests": subs}, nil); err != nil {
				return fmt.Errorf("loadgen: subscribe %s to %d sensors: %w", client, len(chunk), err)
			}
			return nil
		})
	}
	return g.Wait()
}

// Client is a client CreateClients made.
type Client struct{ ID, Secret string }

// CreateClients creates a client per webhook URL, named <prefix><i>, Parallel calls at once
// (there is no batch call for clients); done, if not nil, is called after each.
func (r Registrar) CreateClients(ctx context.Context, prefix string, urls []string, done func()) ([]Client, error) {
	out := make([]Client, len(urls))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.parallel())
	for i, u := range urls {
		g.Go(func() error {
			id, secret, err := r.CreateClient(gctx, prefix+strconv.Itoa(i), u)
			if err != nil {
				return err
			}
			out[i] = Client{id, secret}
			if done != nil {
				done()
			}
			return nil
		})
	}
	return out, g.Wait()
}

package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `locks sensor import` registers a file of sensors a thousand at a time, subscribes a client
// to them, says which line of the file a refusal is about, and can run again.
func TestCLISensorImport(t *testing.T) {
	t.Parallel()
	s := startCLISystem(t, "LOCKS_WEBHOOK_ALLOW_PRIVATE=true")
	env := s.env()
	dir := t.TempDir()
	file := func(name string, lines ...string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lines := []string{"# id,address", ""}
	for i := range 1500 {
		lines = append(lines, fmt.Sprintf("imp%d,Svobody st. %d, room %d", i, i, i))
	}
	fleet := file("fleet.csv", lines...)

	r := expect(t, env, 0, nil, "client", "create", "importer", "--url", "http://127.0.0.1:1/imp", "--json")
	var c struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &c); err != nil || c.ID == "" {
		t.Fatalf("client create --json: %v; %s", err, r)
	}
	expect(t, env, 0, []string{"registered 1500 sensors (0 already were)", "subscribed client " + c.ID + " to 1500 sensors"},
		"sensor", "import", fleet, "--subscribe", c.ID)
	expect(t, env, 0, []string{"Svobody st. 7, room 7"}, "sensor", "get", "imp7")
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+s.httpAddr+"/v1/clients/"+c.ID+"/sensors?page_size=1000", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		Sensors []struct {
			ID string `json:"id"`
		} `json:"sensors"`
		Next string `json:"next_page_token"`
	}
	err = json.NewDecoder(resp.Body).Decode(&page)
	resp.Body.Close()
	if err != nil || len(page.Sensors) != 1000 || page.Next == "" {
		t.Fatalf("the client's sensors: %v, %d on the first page (next %q)", err, len(page.Sensors), page.Next)
	}

	// Again: the first batch is refused, naming the file's lines; with --skip-existing it passes.
	expect(t, env, 1, []string{"lines 3 to 1002", `line 3 id "imp0"`, "already exist", "HTTP 409"}, "sensor", "import", fleet)
	expect(t, env, 0, []string{"registered 0 sensors (1500 already were)"}, "sensor", "import", fleet, "--skip-existing")

	bad := file("bad.csv", "ok1,First", "not-an-id,Second", "ok1,Third")
	expect(t, env, 1, []string{"line 2 id:", "line 3 id:", "HTTP 400"}, "sensor", "import", bad)
	expect(t, env, 1, []string{`sensor "ok1" not found`}, "sensor", "get", "ok1")
	expect(t, env, 2, []string{"line 1: want ID,ADDRESS"}, "sensor", "import", file("noaddr.csv", "lonely"))
	expect(t, env, 2, []string{"holds no sensor"}, "sensor", "import", file("empty.csv", "# nothing"))
}

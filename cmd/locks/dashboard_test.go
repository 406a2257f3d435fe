package main

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"testing"
)

// dashboardClient signs in to the dashboard at base and returns a GET of its pages' bodies.
func dashboardClient(t *testing.T, base, token string) func(path string) string {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	res, err := c.PostForm(base+"/ui/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("dashboard sign-in: %s", res.Status)
	}
	return func(path string) string {
		res, err := c.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
}

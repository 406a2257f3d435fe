package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// docs/receiving-webhooks.md quotes the examples: every go, python and js block in it must be
// a verbatim part of verify.go, verify.py or verify.js, which e2e/receivers_test.go runs
// against real deliveries. Editing one without the other fails here.
func TestDocQuotesTheTestedExamples(t *testing.T) {
	doc, err := os.ReadFile("../receiving-webhooks.md")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"go": "verify.go", "python": "verify.py", "js": "verify.js"}
	quoted := map[string]int{}
	for _, m := range regexp.MustCompile("(?ms)^```(go|python|js)\n(.*?)^```$").FindAllStringSubmatch(string(doc), -1) {
		src, err := os.ReadFile(files[m[1]])
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(src), m[2]) {
			t.Errorf("the %s block of receiving-webhooks.md is not a part of %s:\n%s", m[1], files[m[1]], m[2])
		}
		if strings.Count(m[2], "\n") < 10 {
			t.Errorf("the %s block quotes only %q: want the verify function", m[1], m[2])
		}
		quoted[m[1]]++
	}
	for lang := range files {
		if quoted[lang] != 1 {
			t.Errorf("%d %s blocks in receiving-webhooks.md, want one", quoted[lang], lang)
		}
	}
}

// Verify's own checks, on a delivery signed here from the specification's formula (the
// real deliveries are in e2e/receivers_test.go).
func TestVerifyTheSpecificationsExample(t *testing.T) {
	t.Parallel()
	// Standard Webhooks' published example: secret, id, timestamp, body and signature.
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	h := map[string][]string{
		"Webhook-Id":        {"msg_p5jXN8AQM9LWM0D4loKWxJek"},
		"Webhook-Timestamp": {"1614265330"},
		"Webhook-Signature": {"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
	}
	body := []byte(`{"test": 2432232314}`)
	if err := Verify(secret, h, body, time.Unix(1614265330, 0)); err != nil {
		t.Fatalf("the specification's example: %v", err)
	}
	if err := Verify(secret, h, body, time.Unix(1614265330, 0).Add(Tolerance+time.Second)); err == nil {
		t.Error("a timestamp older than the tolerance was accepted")
	}
}

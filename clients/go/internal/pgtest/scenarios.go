package pgtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// Scenario is one scenario of a behaviours file (clients/behaviours/*.json): steps, each an
// object whose first key is its verb.
type Scenario struct {
	Name  string
	About string
	TTL   float64
	Steps []Step
}

// Step is a step: its verb, and every field of its object (the verb's own value included).
type Step struct {
	Verb string
	Args map[string]any
}

func (s *Step) UnmarshalJSON(data []byte) error {
	decoder := json.NewDecoder(bytes.NewReader(data))
	if _, err := decoder.Token(); err != nil { // {
		return err
	}
	first, err := decoder.Token()
	if err != nil {
		return err
	}
	verb, ok := first.(string)
	if !ok {
		return fmt.Errorf("a step without a verb: %s", data)
	}
	s.Verb = verb
	return json.Unmarshal(data, &s.Args)
}

// Name is the step's verb's value as a name ("a").
func (s Step) Name() string { name, _ := s.Args[s.Verb].(string); return name }

// String is a field, "" when absent.
func (s Step) String(field string) string { value, _ := s.Args[field].(string); return value }

// Bool is a field, def when absent.
func (s Step) Bool(field string, def bool) bool {
	if value, ok := s.Args[field].(bool); ok {
		return value
	}
	return def
}

// Seconds is a field of seconds as a duration, def when absent.
func (s Step) Seconds(field string, def float64) time.Duration {
	value, ok := s.Args[field].(float64)
	if !ok {
		value = def
	}
	return time.Duration(math.Round(value * float64(time.Second)))
}

// Has is whether the step has field (null included).
func (s Step) Has(field string) bool { _, ok := s.Args[field]; return ok }

// Scenarios reads clients/behaviours/file.
func Scenarios(t testing.TB, file string) []Scenario {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(Root(), "clients", "behaviours", file))
	if err != nil {
		t.Fatal(err)
	}
	var behaviours struct{ Scenarios []Scenario }
	if err := json.Unmarshal(data, &behaviours); err != nil {
		t.Fatal(err)
	}
	return behaviours.Scenarios
}

// Crashes is whether a scenario kills the server: such a scenario runs on a cluster of its own,
// since after a crash that reset the fast leases the first grant waits for the clock to pass
// their reservation (up to 10 s), which would hold up the next scenario.
func (s Scenario) Crashes() bool {
	return slices.ContainsFunc(s.Steps, func(step Step) bool { return step.Verb == "crash_server" })
}

// Percentiles is "p50 X ms, p99 Y ms (n samples)" of durations (nearest rank).
func Percentiles(samples []time.Duration) string {
	return fmt.Sprintf("p50 %.2f ms, p99 %.2f ms (%d samples)", Millis(samples, 50), Millis(samples, 99), len(samples))
}

// Millis is the p-th percentile of samples, in milliseconds.
func Millis(samples []time.Duration, p float64) float64 {
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return float64(sorted[max(0, min(len(sorted)-1, rank-1))]) / 1e6
}

// RunScenarios runs body for every scenario of clients/behaviours/file, each as a subtest, on a
// cluster they share (name, port), or for a scenario that crashes the server on one of its own
// (name_crash, crashPort).
func RunScenarios(t *testing.T, file, name string, port, crashPort int, body func(*testing.T, *Cluster, Scenario)) {
	cluster := New(t, name, port)
	for _, scenario := range Scenarios(t, file) {
		t.Run(scenario.Name, func(t *testing.T) {
			c := cluster
			if scenario.Crashes() {
				c = New(t, name+"_crash", crashPort)
			}
			body(t, c, scenario)
		})
	}
}

// Timeline runs a scenario's steps in order, each as a subtest, and keeps when each began: the
// bounds of the behaviours count from the start of the step before.
type Timeline struct {
	PreviousStart, Start, Ended time.Time
	PreviousVerb, Verb          string
}

// Run runs every step, stopping the scenario at the first that fails.
func (tl *Timeline) Run(t *testing.T, steps []Step, step func(*testing.T, Step)) {
	tl.Ended = time.Now()
	for i, s := range steps {
		tl.PreviousStart, tl.PreviousVerb = tl.Start, tl.Verb
		tl.Start, tl.Verb = time.Now(), s.Verb
		if !t.Run(fmt.Sprintf("%d_%s", i, s.Verb), func(t *testing.T) { step(t, s) }) {
			t.FailNow()
		}
		tl.Ended = time.Now()
	}
}

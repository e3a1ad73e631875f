package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// The API server's audit log is the one request count that treats every client alike: raysync and
// External Secrets Operator are told apart by their user agent. Each request, watches included, is
// logged once, when the API server receives it.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["ResponseStarted", "ResponseComplete", "Panic"]
rules:
- level: Metadata
`

type auditLog struct{ path string }

// auditArgs writes the policy into dir and returns the kube-apiserver flags that enable the log.
func auditArgs(dir string) (*auditLog, []string) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	check(os.WriteFile(policy, []byte(auditPolicy), 0o600))
	a := &auditLog{path: filepath.Join(dir, "audit.log")}
	return a, []string{"--audit-policy-file=" + policy, "--audit-log-path=" + a.path,
		"--audit-log-mode=batch", "--audit-log-batch-max-wait=100ms", "--audit-log-maxsize=0"}
}

type auditEvent struct {
	Verb       string    `json:"verb"`
	UserAgent  string    `json:"userAgent"`
	RequestURI string    `json:"requestURI"`
	Received   time.Time `json:"requestReceivedTimestamp"`
	ObjectRef  *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
}

// requests counts the requests whose user agent starts with agent, received in [from, to), by
// "verb resource" (verb as the API server names it: get, list, watch, update, patch, create...).
func (a *auditLog) requests(agent string, from, to time.Time) map[string]int {
	// The batch backend flushes at most every 100 ms; wait past it so the window is complete.
	time.Sleep(time.Until(to.Add(500 * time.Millisecond)))
	f, err := os.Open(a.path)
	check(err)
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, []byte(agent)) { // cheap pre-filter; the user agent is checked below
			continue
		}
		var ev auditEvent
		if json.Unmarshal(line, &ev) != nil || !strings.HasPrefix(ev.UserAgent, agent) || ev.Received.Before(from) || !ev.Received.Before(to) {
			continue
		}
		what := ev.Verb
		if ev.ObjectRef != nil {
			what += " " + ev.ObjectRef.Resource
			if ev.ObjectRef.Subresource != "" {
				what += "/" + ev.ObjectRef.Subresource
			}
		} else {
			what += " " + ev.RequestURI
		}
		out[what]++
	}
	check(sc.Err())
	return out
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// breakdown renders counts as "verb resource: n" sorted by count.
func breakdown(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// quiet waits until agent has made no request for quietFor, at most limit; it returns how long that
// took and whether it happened.
func (a *auditLog) quiet(agent string, quietFor, limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	var offset int64
	var last time.Time
	for {
		time.Sleep(500 * time.Millisecond)
		f, err := os.Open(a.path)
		check(err)
		_, err = f.Seek(offset, 0)
		check(err)
		r := bufio.NewReaderSize(f, 1<<20)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil { // a partial line is read again next time
				break
			}
			offset += int64(len(line))
			if !bytes.Contains(line, []byte(agent)) { // cheap pre-filter; the user agent is checked below
				continue
			}
			var ev auditEvent
			if json.Unmarshal(line, &ev) == nil && strings.HasPrefix(ev.UserAgent, agent) && ev.Received.After(last) {
				last = ev.Received
			}
		}
		f.Close()
		// The batch backend writes up to 100 ms late; quietFor is far longer.
		if time.Since(last) >= quietFor {
			return max(last.Sub(start), 0), true
		}
		if time.Since(start) > limit {
			return time.Since(start), false
		}
	}
}

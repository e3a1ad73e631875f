package framework

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// CallLog is what a client calling an endpoint over and over saw: answers, refusals for the token
// (403), other failures and when the answer changed. Safe for one writer and readers after it stops.
type CallLog struct {
	mu        sync.Mutex
	OK, Fail  int
	Refused   []time.Time    // calls refused for their token (403)
	Bodies    []string       // distinct answers in order
	Errors    map[string]int // other failures: "<status> <body or error>" (cut), counted
	FailedAt  []time.Time    // when those failed
	Slowest   time.Duration  // the slowest answer (Took)
	SlowestAt time.Time
}

// Add records one call made at at: its status (0 for no answer) and body (or error).
func (c *CallLog) Add(code int, body string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case code == http.StatusOK:
		c.OK++
		if n := len(c.Bodies); n == 0 || c.Bodies[n-1] != body {
			c.Bodies = append(c.Bodies, body)
		}
	case code == http.StatusForbidden:
		c.Refused = append(c.Refused, at)
		c.Fail++
	default:
		c.Fail++
		c.FailedAt = append(c.FailedAt, at)
		if c.Errors == nil {
			c.Errors = map[string]int{}
		}
		if len(body) > 120 {
			body = body[:120]
		}
		c.Errors[fmt.Sprintf("%d %s", code, body)]++
	}
}

// Took records how long a call made at at took to answer.
func (c *CallLog) Took(d time.Duration, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > c.Slowest {
		c.Slowest, c.SlowestAt = d, at
	}
}

package standin

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Ray job statuses (ray.job_submission.JobStatus).
const (
	jobPending   = "PENDING"
	jobRunning   = "RUNNING"
	jobSucceeded = "SUCCEEDED"
	jobStopped   = "STOPPED"
)

// jobRequest is the body of POST /api/jobs/ (the fields KubeRay's dashboard client sends).
type jobRequest struct {
	Entrypoint   string            `json:"entrypoint"`
	SubmissionID string            `json:"submission_id"`
	Metadata     map[string]string `json:"metadata"`
	RuntimeEnv   map[string]any    `json:"runtime_env"`
}

// jobInfo is GET /api/jobs/<id> (Ray's JobDetails, the fields KubeRay reads and a few more).
type jobInfo struct {
	Type         string            `json:"type"`
	JobID        string            `json:"job_id"`
	SubmissionID string            `json:"submission_id"`
	Status       string            `json:"status"`
	Entrypoint   string            `json:"entrypoint"`
	Message      string            `json:"message"`
	StartTime    int64             `json:"start_time,omitempty"`
	EndTime      int64             `json:"end_time,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	RuntimeEnv   map[string]any    `json:"runtime_env,omitempty"`
}

type job struct {
	req         jobRequest
	id          string
	submittedAt time.Time
	stoppedAt   time.Time
	runFor      time.Duration // the store's, unless the entrypoint says "sleep N"
}

// sleepEntrypoint is an entrypoint that asks the emulated job to run for N seconds.
var sleepEntrypoint = regexp.MustCompile(`\bsleep (\d+)\b`)

// jobStore is a head's job manager. A job waits pendingFor, runs for runFor, then succeeds.
type jobStore struct {
	mu         sync.Mutex
	jobs       map[string]*job
	pendingFor time.Duration
	runFor     time.Duration
}

func newJobStore(pendingFor, runFor time.Duration) *jobStore {
	return &jobStore{jobs: map[string]*job{}, pendingFor: pendingFor, runFor: runFor}
}

var errDuplicateSubmission = fmt.Errorf("already exists")

func (s *jobStore) submit(req jobRequest, now time.Time) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := req.SubmissionID
	if id == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		id = "raysubmit_" + hex.EncodeToString(b)
	}
	if _, ok := s.jobs[id]; ok {
		return id, fmt.Errorf("job with submission_id %s %w; please use a different submission_id", id, errDuplicateSubmission)
	}
	j := &job{req: req, id: id, submittedAt: now, runFor: s.runFor}
	if m := sleepEntrypoint.FindStringSubmatch(req.Entrypoint); m != nil {
		secs, _ := strconv.Atoi(m[1])
		j.runFor = time.Duration(secs) * time.Second
	}
	s.jobs[id] = j
	return id, nil
}

func (s *jobStore) status(j *job, now time.Time) (status string, end time.Time) {
	natural := j.submittedAt.Add(s.pendingFor + j.runFor)
	switch {
	case !j.stoppedAt.IsZero() && j.stoppedAt.Before(natural):
		return jobStopped, j.stoppedAt
	case now.Before(j.submittedAt.Add(s.pendingFor)):
		return jobPending, time.Time{}
	case now.Before(natural):
		return jobRunning, time.Time{}
	}
	return jobSucceeded, natural
}

func (s *jobStore) info(j *job, now time.Time) jobInfo {
	status, end := s.status(j, now)
	i := jobInfo{Type: "SUBMISSION", JobID: j.id, SubmissionID: j.id, Status: status, Entrypoint: j.req.Entrypoint,
		Message: jobMessages[status], Metadata: j.req.Metadata, RuntimeEnv: j.req.RuntimeEnv}
	if status != jobPending {
		i.StartTime = j.submittedAt.Add(s.pendingFor).UnixMilli()
	}
	if !end.IsZero() {
		i.EndTime = end.UnixMilli()
	}
	return i
}

var jobMessages = map[string]string{
	jobPending:   "Job has not started yet. It may be waiting for resources (CPUs, GPUs, custom resources) to become available.",
	jobRunning:   "Job is currently running.",
	jobSucceeded: "Job finished successfully.",
	jobStopped:   "Job was intentionally stopped.",
}

func terminal(status string) bool { return status == jobSucceeded || status == jobStopped }

func (s *jobStore) get(id string, now time.Time) (jobInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	if !ok {
		return jobInfo{}, false
	}
	return s.info(j, now), true
}

func (s *jobStore) list(now time.Time) []jobInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]jobInfo, 0, len(s.jobs))
	for _, j := range s.jobs {
		out = append(out, s.info(j, now))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SubmissionID < out[j].SubmissionID })
	return out
}

// stop stops a job that has not finished; it reports whether it did.
func (s *jobStore) stop(id string, now time.Time) (stopped, found bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	if !ok {
		return false, false
	}
	if status, _ := s.status(j, now); terminal(status) {
		return false, true
	}
	j.stoppedAt = now
	return true, true
}

// remove deletes a finished job; a running one is refused with its status.
func (s *jobStore) remove(id string, now time.Time) (status string, found bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	if !ok {
		return "", false
	}
	status, _ = s.status(j, now)
	if terminal(status) {
		delete(s.jobs, id)
	}
	return status, true
}

func (s *jobStore) logs(id string, now time.Time) (string, bool) {
	info, ok := s.get(id, now)
	if !ok {
		return "", false
	}
	logs := fmt.Sprintf("emulated Ray job %s: %s\n", id, info.Status)
	if info.Status == jobSucceeded {
		logs += "emulated entrypoint finished\n"
	}
	return logs, true
}

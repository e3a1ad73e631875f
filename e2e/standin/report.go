package standin

import "time"

// Caller is who talks to an emulated Ray process. The stand-in knows it from where the call comes
// in: the operator's proxy port, the clients' proxy port, or a container it runs itself.
type Caller string

const (
	CallerOperator  Caller = "operator"  // the KubeRay operator (its HTTP_PROXY)
	CallerClient    Caller = "client"    // anyone else outside the cluster (tests, bench, you)
	CallerWorker    Caller = "worker"    // a worker's raylet, its wait-gcs-ready, the autoscaler
	CallerSubmitter Caller = "submitter" // a RayJob submitter pod (K8s-Job mode)
)

// RequestCounts are a Ray head's answers to one caller.
type RequestCounts struct {
	Accepted        int `json:"accepted"`
	Unauthenticated int `json:"unauthenticated"` // 401: no token presented
	Forbidden       int `json:"forbidden"`       // 403: the wrong token
}

// Rejected is every request refused for its token.
func (c RequestCounts) Rejected() int { return c.Unauthenticated + c.Forbidden }

// ClusterStats is what happened to one RayCluster's Ray processes.
type ClusterStats struct {
	Namespace string                   `json:"namespace"`
	Cluster   string                   `json:"cluster"`
	Requests  map[Caller]RequestCounts `json:"requests"`
	// JoinFailures counts GCS connections refused for their token (a worker's raylet, its
	// wait-gcs-ready init container, the autoscaler).
	JoinFailures int `json:"joinFailures"`
	// Restarts counts container restarts in the cluster's pods.
	Restarts int `json:"restarts"`
}

// ContainerStart records one container start: the token fingerprint it started with is the one
// it keeps until it restarts.
type ContainerStart struct {
	Namespace    string    `json:"namespace"`
	Pod          string    `json:"pod"`
	PodUID       string    `json:"podUID"`
	Cluster      string    `json:"cluster,omitempty"`
	NodeType     string    `json:"nodeType,omitempty"` // head, worker, submitter
	Container    string    `json:"container"`
	Init         bool      `json:"init,omitempty"`
	RestartCount int       `json:"restartCount"`
	StartedAt    time.Time `json:"startedAt"`
	// TokenFingerprint names the RAY_AUTH_TOKEN it started with ("" without one).
	TokenFingerprint string `json:"tokenFingerprint,omitempty"`
}

// PodReport is one pod as the stand-in runs it.
type PodReport struct {
	Namespace  string            `json:"namespace"`
	Name       string            `json:"name"`
	UID        string            `json:"uid"`
	IP         string            `json:"ip"`
	Phase      string            `json:"phase"`
	Containers []ContainerReport `json:"containers"`
}

// ContainerReport is one container's current run.
type ContainerReport struct {
	Name         string `json:"name"`
	Init         bool   `json:"init,omitempty"`
	State        string `json:"state"`            // waiting, running, terminated
	Reason       string `json:"reason,omitempty"` // e.g. CreateContainerConfigError, CrashLoopBackOff
	RestartCount int    `json:"restartCount"`
	// TokenFingerprint names the RAY_AUTH_TOKEN of the current run ("" if none or not started).
	TokenFingerprint string `json:"tokenFingerprint,omitempty"`
	// Log is a real container's stdout and stderr of its current (or last) run.
	Log string `json:"log,omitempty"`
}

// ProxyStats counts what the HTTP proxies routed, per caller.
type ProxyStats map[Caller]ProxyCounts

// ProxyCounts are one caller's proxied requests.
type ProxyCounts struct {
	ToService   int `json:"toService"`   // Host was a Service name, routed to a pod it selects
	ToPodIP     int `json:"toPodIP"`     // Host was a pod IP the stand-in gave out
	UnknownHost int `json:"unknownHost"` // answered 502: nothing of the stand-in's has that name
	Refused     int `json:"refused"`     // answered 502: known host, nothing listening on that port
}

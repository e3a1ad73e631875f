// Package standin is a kubelet and Ray stand-in for the local control plane: it starts the pods of
// Ray clusters (heads, workers, RayJob submitters) as a kubelet would, and runs an emulation of Ray
// in each, so tests see what Ray does with the tokens raysync manages.
//
// What it does, as the kubelet would:
//   - admits a Ray pod after a start delay, binds it to the one Node it registers, gives it an IP;
//   - "pulls" images: images of the private registry need an imagePullSecrets entry whose Secret has
//     credentials for that registry (checked at every container creation), others always pull;
//   - resolves every container's env (value, secretKeyRef, configMapKeyRef, fieldRef, envFrom) once,
//     when it creates the container, init containers first and in order; a missing Secret, ConfigMap
//     or key leaves the container in CreateContainerConfigError (unless optional) and is retried;
//   - restarts failed containers per restartPolicy, the first time at once, then with an exponential
//     back-off (CrashLoopBackOff);
//   - writes pod status through the pods/status subresource (containers behind init containers wait
//     PodInitializing), and finishes graceful deletions with the terminal status, then the object;
//   - records the kubelet's Events (Pulled, Failed, BackOff, Created, Started, Killing, ...);
//   - when it restarts, adopts the pods bound to its Node like a rebooted node: same IPs, containers
//     started again and counted as restarts.
//
// What it does, as Ray would:
//   - each Ray process loads RAY_AUTH_TOKEN once at start and accepts exactly that token;
//   - the head serves the dashboard's Jobs and Serve APIs and the Serve proxy's /-/healthz with
//     Ray's HTTP auth (Authorization: Bearer, then X-Ray-Authorization, then the cookie
//     ray-authentication-token; missing 401, wrong 403);
//   - workers, the wait-gcs-ready init container and the autoscaler reach their head's GCS only with
//     the head's token; a RayJob submitter is a client of its head presenting its own token.
//
// Pod IPs come from 198.19.0.0/16 (RFC 2544 benchmarking range) and the Node's from 198.18.0.0/16:
// they are data for the API server, Endpoints and EndpointSlices, never dialled. Everything the
// stand-in serves listens on loopback: the KubeRay operator reaches heads and pod IPs through the
// stand-in's HTTP proxy (HTTP_PROXY), which routes by Host and never opens a connection itself.
//
// TestStandInMatchesRealKubelet (e2e/realnode) compares all of this with a real kubelet.
//
// Not emulated: images and their contents, scheduling beyond binding to the one Node, probes,
// resources, volumes, Ray itself beyond the calls above (no tasks, actors, autoscaling), gRPC, TLS,
// Kubernetes token auth (enableK8sTokenAuth), $(VAR) expansion in env values.
package standin

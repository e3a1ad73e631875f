// Package projection decides what every in-scope RayCluster's Secrets and pod templates must hold,
// and makes it so. Data flows one way, one step per file:
//
//   - gather.go reads the informer caches (and raysync's memory) into a ClusterInput; no API call.
//   - plan_*.go are the planners, pure functions of that input: no clients, no logs, no metrics, no
//     clock but ClusterInput.Now (purity_test.go checks). plan_token.go the auth Secret,
//     plan_copies.go managed copies and pruning, plan_pods.go pull secrets and autoscaler TLS on
//     templates and pods (internal/podtemplate), plan_rotation.go where a running cluster stands
//     with its token, plan_wave.go and plan_wave_patches.go the fleet's replacements and restarts.
//   - plan.go composes them into a ClusterPlan: its Actions, and the cluster's status.
//   - apply.go (and apply_rotation.go) executes the Actions with preconditions: every API write.
//
// controller.go runs the work queue around these steps. status.go reports the same plans to the
// metrics and `syncer status`, so what raysync does and what it reports are one decision.
// admission.go gives the webhook its decisions, from the same caches and planners. Sources are
// checked by internal/validate, and rotations numbered by internal/ledger.
//
// A cluster's token Secret, and when raysync writes it (Ray accepts only the token a process
// started with):
//
//  1. Created: by raysync before KubeRay looks for it, by the webhook as KubeRay creates it, or by
//     KubeRay alone.
//  2. Written with the canonical token while no container that reads it can have started.
//  3. Frozen once a container may have read it: the cluster is then current or behind, and only a
//     Secret changed under containers known to run on the current token is put back.
//  4. Rewritten only inside a restart (once no pod is left), or replaced with the cluster (a
//     RayService replacement); plan_wave.go decides when.
package projection

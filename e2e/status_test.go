package e2e

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// status runs `syncer status` and returns its output and exit code.
func (e *Env) status(args ...string) (string, int) { return e.syncerCLI("status", args...) }

// syncerCLI runs `syncer <command>` with the admin kubeconfig and returns its stdout, then its stderr,
// and its exit code. It fails the test if the output holds a secret value the test made.
func (e *Env) syncerCLI(command string, args ...string) (string, int) {
	e.t.Helper()
	path, err := buildSyncer()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(path, append([]string{command, "--kubeconfig=" + e.Kubeconfig}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		e.t.Fatal(err)
	}
	for _, v := range e.secrets {
		if strings.Contains(string(out)+stderr.String(), v) {
			e.t.Errorf("syncer %s printed a secret value", command)
		}
	}
	return string(out) + stderr.String(), code
}

func TestStatusCommand(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns, token := env.NamespaceWithToken()
		env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		env.CreateRayCluster(rayCluster(ns, "good"))
		env.WaitSecret(ns, "good", 30*time.Second, holds(token))
		flags := []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns}

		out, code := env.status(flags...)
		if code != 0 || !strings.Contains(out, "good") || !regexpLine(out, ns, "good", "-", "generated", "in-sync", "current", "0", "-", "-") {
			t.Fatalf("all in sync: exit %d\n%s", code, out)
		}

		foreignToken := env.NewToken()
		if _, err := env.Kube.CoreV1().Secrets(ns).Create(env.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "foreign", Namespace: ns},
			Data: tokenData(foreignToken)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		env.CreateRayCluster(rayCluster(ns, "foreign"))
		env.WaitEvent(ns, "foreign", "TargetNotOwned", 30*time.Second)
		out, code = env.status(flags...)
		if code != 1 || !regexpLine(out, ns, "foreign", "-", "generated", "not-owned") {
			t.Fatalf("foreign target: exit %d\n%s", code, out)
		}
		out, code = env.status(append(flags, "-o", "json")...)
		var report struct {
			InSync   bool
			Clusters []struct {
				RayCluster string
				Token      string
				Mode       string
			}
		}
		if err := json.Unmarshal([]byte(out), &report); err != nil || code != 1 || report.InSync || len(report.Clusters) != 2 {
			t.Fatalf("json: exit %d, err %v\n%s", code, err, out)
		}
		for _, c := range report.Clusters {
			want := map[string]string{"good": "in_sync", "foreign": "not_owned"}[c.RayCluster]
			if c.Token != want || c.Mode != "generated" {
				t.Errorf("json %s: token %q mode %q, want %q", c.RayCluster, c.Token, c.Mode, want)
			}
		}
		// Errors exit 2 with one line.
		if out, code := env.status("--auth-source=nope", "--namespaces="+ns); code != 2 || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("bad flag: exit %d\n%s", code, out)
		}
		if out, code := env.status(append(flags, "-o", "yaml")...); code != 2 {
			t.Errorf("bad -o: exit %d\n%s", code, out)
		}
	})
}

// regexpLine reports whether some line of out has exactly these whitespace-separated fields first.
func regexpLine(out string, fields ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < len(fields) {
			continue
		}
		match := true
		for i := range fields {
			if f[i] != fields[i] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

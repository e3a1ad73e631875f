package standin

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// objectSource reads the Secrets and ConfigMaps a container's env refers to. The kubelet reads them
// when it creates the container; the stand-in reads them live from the API server at that moment.
type objectSource interface {
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
}

// podNetwork is what fieldRefs to status.* resolve to.
type podNetwork struct{ podIP, hostIP string }

// resolveEnv computes a container's environment as the kubelet does when it creates the container:
// envFrom first (in order), then env (later entries win). A missing Secret, ConfigMap or key is an
// error (the kubelet's CreateContainerConfigError, with its message) unless the reference is
// optional, in which case the variable is simply not set. $(VAR) references are not expanded.
func resolveEnv(ctx context.Context, src objectSource, pod *corev1.Pod, c *corev1.Container, net podNetwork) (map[string]string, error) {
	ns := pod.Namespace
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		switch {
		case from.SecretRef != nil:
			s, err := src.Secret(ctx, ns, from.SecretRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && isTrue(from.SecretRef.Optional) {
					continue
				}
				return nil, err
			}
			for k, v := range s.Data {
				env[from.Prefix+k] = string(v)
			}
		case from.ConfigMapRef != nil:
			cm, err := src.ConfigMap(ctx, ns, from.ConfigMapRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && isTrue(from.ConfigMapRef.Optional) {
					continue
				}
				return nil, err
			}
			for k, v := range cm.Data {
				env[from.Prefix+k] = v
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
			continue
		}
		v, set, err := resolveValueFrom(ctx, src, pod, e.ValueFrom, net)
		if err != nil {
			return nil, err
		}
		if set {
			env[e.Name] = v
		}
	}
	return env, nil
}

func resolveValueFrom(ctx context.Context, src objectSource, pod *corev1.Pod, from *corev1.EnvVarSource, net podNetwork) (value string, set bool, err error) {
	ns := pod.Namespace
	switch {
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := src.Secret(ctx, ns, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, err
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("couldn't find key %s in Secret %s/%s", ref.Key, ns, ref.Name)
		}
		return string(v), true, nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := src.ConfigMap(ctx, ns, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, err
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, ns, ref.Name)
		}
		return v, true, nil
	case from.FieldRef != nil:
		v, err := podField(pod, from.FieldRef.FieldPath, net)
		return v, err == nil, err
	}
	// resourceFieldRef and anything newer: not emulated, left unset.
	return "", false, nil
}

// podField resolves the downward API's fieldRef paths.
func podField(pod *corev1.Pod, path string, net podNetwork) (string, error) {
	if k, ok := mapKey(path, "metadata.labels"); ok {
		return pod.Labels[k], nil
	}
	if k, ok := mapKey(path, "metadata.annotations"); ok {
		return pod.Annotations[k], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return net.podIP, nil
	case "status.hostIP", "status.hostIPs":
		return net.hostIP, nil
	}
	return "", fmt.Errorf("unsupported fieldPath %q", path)
}

// mapKey parses `metadata.labels['key']`.
func mapKey(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"['")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "']")
}

func isTrue(b *bool) bool { return b != nil && *b }

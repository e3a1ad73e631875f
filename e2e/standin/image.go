package standin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// registryHost is the registry an image reference pulls from, as Docker reads references: the
// first path component is a host when it has a dot or a port or is localhost; otherwise Docker Hub.
func registryHost(image string) string {
	first, _, found := strings.Cut(image, "/")
	if found && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return first
	}
	return "docker.io"
}

// credentialHosts lists the registries a pull Secret holds credentials for (nil if it holds none
// or is not a pull Secret).
func credentialHosts(s *corev1.Secret) []string {
	var entries map[string]json.RawMessage
	switch s.Type {
	case corev1.SecretTypeDockerConfigJson:
		var cfg struct {
			Auths map[string]json.RawMessage `json:"auths"`
		}
		if json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], &cfg) != nil {
			return nil
		}
		entries = cfg.Auths
	case corev1.SecretTypeDockercfg:
		if json.Unmarshal(s.Data[corev1.DockerConfigKey], &entries) != nil {
			return nil
		}
	default:
		return nil
	}
	var hosts []string
	for k := range entries {
		k = strings.TrimPrefix(strings.TrimPrefix(k, "https://"), "http://")
		host, _, _ := strings.Cut(k, "/")
		hosts = append(hosts, host)
	}
	return hosts
}

// pullImage decides whether a container's image can be pulled. Images of privateRegistry need
// credentials for it in one of the pod's imagePullSecrets; every other image pulls. The check runs
// at every container creation, as if each image were pulled anew (imagePullPolicy: Always, or the
// kubelet's KubeletEnsureSecretPulledImages): an image another pod pulled does not help. missing
// names the pod's pull Secrets that do not exist (the kubelet warns about them and pulls without).
func pullImage(ctx context.Context, src objectSource, pod *corev1.Pod, image, privateRegistry string) (missing []string, err error) {
	host := registryHost(image)
	found := false
	for _, ref := range pod.Spec.ImagePullSecrets {
		s, err := src.Secret(ctx, pod.Namespace, ref.Name)
		if err != nil {
			missing = append(missing, ref.Name)
			continue
		}
		found = found || slices.Contains(credentialHosts(s), host)
	}
	if privateRegistry == "" || host != privateRegistry || found {
		return missing, nil
	}
	return missing, fmt.Errorf("failed to pull image %q: pull access denied, repository does not exist or may require authorization: authorization failed: no basic auth credentials", image)
}

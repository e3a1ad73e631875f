package framework

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WebhookConfiguration is raysync's mutating webhook configuration as the chart installs it with a pull
// secret configured, but
// URL-form (the API server calls raysync on 127.0.0.1:port) and limited to namespaces. No caBundle:
// raysync injects it.
func WebhookConfiguration(name string, port int, namespaces []string) *admissionregistrationv1.MutatingWebhookConfiguration {
	ignore := admissionregistrationv1.Ignore
	none, onDryRun := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.SideEffectClassNoneOnDryRun
	never := admissionregistrationv1.NeverReinvocationPolicy
	timeout := int32(2)
	hook := func(name, resource, path string, labels *metav1.LabelSelector) admissionregistrationv1.MutatingWebhook {
		sideEffects := &none
		if resource == "secrets" {
			sideEffects = &onDryRun // raysync creates the cluster's auth Secret itself
		}
		url := fmt.Sprintf("https://127.0.0.1:%d%s", port, path)
		return admissionregistrationv1.MutatingWebhook{Name: name, ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{resource}}}},
			FailurePolicy: &ignore, SideEffects: sideEffects, TimeoutSeconds: &timeout, ReinvocationPolicy: &never,
			AdmissionReviewVersions: []string{"v1"}, ObjectSelector: labels,
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: namespaces}}}}
	}
	exists := []metav1.LabelSelectorRequirement{{Key: "ray.io/cluster", Operator: metav1.LabelSelectorOpExists}}
	return &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			hook("pods.raysync.dev", "pods", "/mutate-pods", &metav1.LabelSelector{
				MatchLabels: map[string]string{"app.kubernetes.io/created-by": "kuberay-operator"}, MatchExpressions: exists}),
			hook("secrets.raysync.dev", "secrets", "/mutate-secrets", &metav1.LabelSelector{MatchExpressions: exists}),
			// A RayJob's submitter pods (the chart has it with a pull secret configured).
			hook("submitters.raysync.dev", "pods", "/mutate-pods", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "batch.kubernetes.io/job-name", Operator: metav1.LabelSelectorOpExists}}}),
		}}
}

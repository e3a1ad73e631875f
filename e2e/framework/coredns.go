package framework

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

const (
	// CoreDNSVersion is the cluster DNS of the real node (e2e/tools/coredns), run as a pod.
	CoreDNSVersion = "v1.15.0"
	// CoreDNSImage is built here (one static binary) and imported into the node's containerd.
	CoreDNSImage = "raysync-e2e.local/coredns:" + CoreDNSVersion
	// ClusterDNSIP is the kube-dns Service's address, the kubelet's clusterDNS.
	ClusterDNSIP = "198.18.128.10"
)

// corefile serves cluster.local from the API server and nothing else: no forward plugin, so a pod
// resolves no name outside the cluster (there is nothing to reach).
const corefile = `.:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loop
    reload
}
`

// deployCoreDNS creates CoreDNS as kubeadm does (ServiceAccount, ClusterRole, ConfigMap, Deployment,
// the kube-dns Service) and waits until it is available.
func deployCoreDNS(ctx context.Context, kube kubernetes.Interface) error {
	const ns, name = "kube-system", "coredns"
	labels := map[string]string{"k8s-app": "kube-dns"}
	objs := []func() error{
		func() error {
			_, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"}, Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
				{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
			}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
				RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:coredns"},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name},
				Data: map[string]string{"Corefile": corefile}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
				Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
						ServiceAccountName: name, DNSPolicy: corev1.DNSDefault, PriorityClassName: "system-cluster-critical",
						Containers: []corev1.Container{{Name: name, Image: CoreDNSImage, ImagePullPolicy: corev1.PullNever,
							Args: []string{"-conf", "/etc/coredns/Corefile"},
							Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
								{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP}},
							ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}},
								PeriodSeconds: 1},
							VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
						}},
						Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}},
					}}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Labels: labels},
				Spec: corev1.ServiceSpec{ClusterIP: ClusterDNSIP, Selector: labels, Ports: []corev1.ServicePort{
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
					{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)}}}}, metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range objs {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("coredns: %w", err)
		}
	}
	var last string
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		d, err := kube.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && d.Status.AvailableReplicas == 1 {
			return nil
		}
		if err == nil {
			last = fmt.Sprintf("%+v", d.Status)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return fmt.Errorf("coredns never available: %s", last)
}

{{- define "raysync.name" -}}raysync{{- end -}}

{{- define "raysync.fullname" -}}
{{- if contains "raysync" .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-raysync" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{/* The install's name: its Lease, rotation ledger (<name>-rotations) and gateway table
     (<name>-gateway). Every release has its own, so releases side by side never share a writer. */}}
{{- define "raysync.instanceName" -}}{{ default (include "raysync.fullname" .) .Values.name }}{{- end -}}

{{/* A Go duration of h, m, s and ms parts in milliseconds ("0" is 0). */}}
{{- define "raysync.durationMs" -}}
{{- $ms := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|h|m|s)" (toString .) -1 -}}
{{- $n := float64 (regexFind "^[0-9]+(\\.[0-9]+)?" .) -}}
{{- $u := regexFind "(ms|h|m|s)$" . -}}
{{- $ms = addf $ms (mulf $n (get (dict "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0) $u)) -}}
{{- end -}}
{{- $ms -}}
{{- end -}}

{{- define "raysync.labels" -}}
app.kubernetes.io/name: raysync
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The gateway's pods are not the controller's: a selector of one must never match the other. */}}
{{- define "raysync.gatewayLabels" -}}
app.kubernetes.io/name: raysync-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "raysync.gatewaySelectorLabels" -}}
app.kubernetes.io/name: raysync-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "raysync.selectorLabels" -}}
app.kubernetes.io/name: raysync
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "raysync.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "raysync.fullname" .) .Values.serviceAccount.name }}{{- else -}}{{ required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{/* The RBAC scope: rbac.scope when set; otherwise namespaced Roles when namespaces are listed, and
     a ClusterRole only for allNamespaces (least privilege by default). */}}
{{- define "raysync.rbacScope" -}}
{{- if .Values.rbac.scope -}}{{ .Values.rbac.scope }}{{- else if .Values.namespaces -}}namespaces{{- else -}}cluster{{- end -}}
{{- end -}}

{{/* Every source Secret as a list of "NAMESPACE/NAME". */}}
{{- define "raysync.sources" -}}
{{- $s := list (printf "%s/%s" .Values.authSource.namespace .Values.authSource.name) -}}
{{- range .Values.pullSecrets }}{{ $s = append $s . }}{{ end -}}
{{- if .Values.autoscalerTLS.secret }}{{ $s = append $s .Values.autoscalerTLS.secret }}{{ end -}}
{{- toJson $s -}}
{{- end -}}

{{/* What raysync does in a namespace with RayClusters (both RBAC scopes). */}}
{{- define "raysync.workloadRules" -}}
# patch: template entries, and rotations (a restart suspends the cluster; marks on it)
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["get", "list", "watch", "patch"]
# A replacement is a server-side apply of raysync's own fields on the RayService; RayJobs are read to
# leave their cluster alone while the job runs.
- apiGroups: ["ray.io"]
  resources: ["rayservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch"]
{{- if .Values.gateway.enabled }}
# The gateway's stable address per RayService and RayCluster: an ExternalName Service <object>-gw
# raysync creates (owned by the object, so garbage-collected with it) and never one it does not own.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "update", "delete"]
{{- end }}
# Pre-created auth Secrets carry a blockOwnerDeletion ownerReference to their RayCluster, which the
# OwnerReferencesPermissionEnforcement admission plugin only allows with update on the finalizers.
- apiGroups: ["ray.io"]
  resources: ["rayclusters/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "update", "delete"]
# delete: a pod whose container may have read the token its Secret held before raysync's write (recycled
# so that KubeRay recreates it on the canonical one), and, with pull secrets or the autoscaler's TLS, a
# pending pod created without them.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/* The admission webhook's Service, its DNS names (the serving certificate's SANs) and the Secret raysync
     keeps its self-issued serving certificate in (self-managed mode). */}}
{{- define "raysync.webhookService" -}}{{ include "raysync.fullname" . }}-webhook{{- end -}}
{{- define "raysync.webhookDNSNames" -}}
{{- $svc := include "raysync.webhookService" . -}}
{{- list (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) | toJson -}}
{{- end -}}
{{/* fullname, not instanceName: the Secret 0.1.0 wrote stays the one a release uses whatever its name value. */}}
{{/* Named after the install's name, as `syncer uninstall --name` derives them: <name>-webhook-tls and <name>. */}}
{{- define "raysync.webhookCertSecret" -}}{{ include "raysync.instanceName" . }}-webhook-tls{{- end -}}
{{- define "raysync.webhookConfiguration" -}}{{ include "raysync.instanceName" . }}{{- end -}}
{{- define "raysync.webhookCertDir" -}}/etc/raysync/webhook-tls{{- end -}}
{{/* raysync issues and rotates the serving certificate and keeps the caBundle itself unless cert-manager does. */}}
{{- define "raysync.webhookSelfManaged" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) -}}true{{- end -}}
{{- end -}}

{{/* raysync's image; the chart refuses to render without a repository rather than pull a name nobody published. */}}
{{- define "raysync.image" -}}
{{- $repo := required "image.repository is not set: there is no official registry yet; publish raysync with `make release REGISTRY=...` (its chart sets it) or set image.repository to where you pushed the image" .Values.image.repository -}}
{{ $repo }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}


{{/* The docs site's base URL, ending in "/": every alert and the notes link to pages under it. */}}
{{- define "raysync.docs" -}}
{{ trimSuffix "/" .Values.docsURL }}/
{{- end -}}

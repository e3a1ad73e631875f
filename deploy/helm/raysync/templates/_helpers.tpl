{{- define "raysync.name" -}}raysync{{- end -}}

{{- define "raysync.fullname" -}}
{{- if contains "raysync" .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-raysync" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "raysync.labels" -}}
app.kubernetes.io/name: raysync
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
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
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["get", "list", "watch"{{ if or .Values.pullSecrets .Values.autoscalerTLS.secret }}, "patch"{{ end }}]
# Pre-created auth Secrets carry a blockOwnerDeletion ownerReference to their RayCluster, which the
# OwnerReferencesPermissionEnforcement admission plugin only allows with update on the finalizers.
- apiGroups: ["ray.io"]
  resources: ["rayclusters/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "update", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"{{ if and (or .Values.pullSecrets .Values.autoscalerTLS.secret) .Values.recyclePendingPods }}, "delete"{{ end }}]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

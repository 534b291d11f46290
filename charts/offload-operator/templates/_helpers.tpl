{{- define "offload.name" -}}offload-operator{{- end -}}
{{- define "offload.labels" -}}
app.kubernetes.io/name: offload-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "offload.operatorSelector" -}}
app.kubernetes.io/name: offload-operator
app.kubernetes.io/component: operator
{{- end -}}
{{- define "offload.agentSelector" -}}
app.kubernetes.io/name: offload-operator
app.kubernetes.io/component: agent
{{- end -}}
{{- define "offload.webhookService" -}}offload-operator-webhook{{- end -}}
{{- define "offload.certNames" -}}
{{- if .Values.webhook.certificateNames -}}
{{- join "," .Values.webhook.certificateNames -}}
{{- else -}}
{{ include "offload.webhookService" . }}.{{ .Release.Namespace }}.svc,{{ include "offload.webhookService" . }}.{{ .Release.Namespace }}.svc.cluster.local
{{- end -}}
{{- end -}}
{{- define "offload.clientConfig" -}}
{{- if .root.Values.webhook.url }}
url: {{ printf "%s%s" .root.Values.webhook.url .path }}
{{- else }}
service:
  name: {{ include "offload.webhookService" .root }}
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path }}
  port: 443
{{- end }}
{{- end -}}

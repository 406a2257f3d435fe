{{/* The release's name prefix, at most 63 characters with a part's suffix room kept. */}}
{{- define "lock-sensors.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lock-sensors.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selects every pod of one part (all its shares): dict "ctx" $ "part" name. */}}
{{- define "lock-sensors.selector" -}}
app.kubernetes.io/name: {{ .ctx.Chart.Name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .part }}
{{- end -}}

{{- define "lock-sensors.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "lock-sensors.fullname" .)) -}}
{{- end -}}

{{/* LOCKS_NATS_URL for a part: every server with the part's user and $(NATS_PASSWORD), which
     Kubernetes expands from the env var of that name set before it. */}}
{{- define "lock-sensors.natsURL" -}}
{{- $urls := list -}}
{{- range .ctx.Values.natsServers -}}
{{- $u := urlParse . -}}
{{- $urls = append $urls (printf "%s://%s:$(NATS_PASSWORD)@%s" $u.scheme $.part $u.host) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

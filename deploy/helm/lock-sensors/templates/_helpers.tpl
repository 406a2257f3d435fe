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

{{- define "lock-sensors.natsAccountsName" -}}
{{- .Values.natsAccounts.name | default (printf "%s-nats-accounts" (include "lock-sensors.fullname" .)) -}}
{{- end -}}

{{- define "lock-sensors.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The config values that are set, as env entries. */}}
{{- define "lock-sensors.configEnv" -}}
{{- range $k, $v := .Values.config }}
{{- if ne (toString $v) "" }}
- {name: {{ $k }}, value: {{ toString $v | quote }}}
{{- end }}
{{- end }}
{{- end -}}

{{/* A variable from the chart's Secret: dict "ctx" $ "key" name "optional" bool. */}}
{{- define "lock-sensors.secretEnv" -}}
- name: {{ .key }}
  valueFrom: {secretKeyRef: {name: {{ include "lock-sensors.secretName" .ctx }}, key: {{ .key }}{{ if .optional }}, optional: true{{ end }}}}
{{- end -}}

{{/* What each part needs besides NATS (cmd/locks/run.go); history migrates ClickHouse under a
     Postgres lock, so it gets Postgres too; the watchdog reads the RabbitMQ queue's depth. */}}
{{- define "lock-sensors.needs" -}}
{{- $n := dict
  "bridge" (list "postgres" "rabbitmq")
  "state" (list "postgres")
  "history" (list "postgres" "clickhouse")
  "notifier" (list "postgres" "webhooks")
  "watchdog" (list "postgres" "rabbitmq")
  "api" (list "postgres" "clickhouse")
  "alerter" (list "postgres" "clickhouse" "webhooks")
  "migrate" (list "postgres" "clickhouse") -}}
{{- get $n . | toJson -}}
{{- end -}}

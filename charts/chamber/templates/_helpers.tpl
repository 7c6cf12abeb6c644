{{/* Names */}}
{{- define "chamber.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "chamber.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<component>", for the object of one component. Call with (list $ "component"). */}}
{{- define "chamber.component" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "chamber.fullname" $root) (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "chamber.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "chamber.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "chamber.labels" -}}
{{- $root := index . 0 -}}
{{ include "chamber.selectorLabels" . }}
app.kubernetes.io/part-of: chamber
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" }}
{{- with $root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "chamber.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Services that run in the chosen mode (and are enabled). monitor only observes. */}}
{{- define "chamber.monitorServices" -}}
discovery health recorder gateway perf
{{- end -}}

{{- define "chamber.serviceRuns" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- if not (include "chamber.actuatorOnly" $root) -}}
{{- if eq $name "dispatch" -}}
{{- if include "chamber.dispatchRuns" $root -}}
true
{{- end -}}
{{- else -}}
{{- $svc := index $root.Values.services $name -}}
{{- if and $svc.enabled (or (eq $root.Values.mode "manage") (has $name (splitList " " (include "chamber.monitorServices" $root)))) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Multi-cluster dispatch. The control plane (dispatch.enabled, manage mode) runs the dispatcher and
this cluster's actuator; an actuator-only install (dispatch.actuator.enabled) runs nothing else but,
with dispatch.actuator.nodeAgents, the node agents (chamber.memberAgents). */}}
{{- define "chamber.actuatorOnly" -}}
{{- if .Values.dispatch.actuator.enabled -}}true{{- end -}}
{{- end -}}

{{- define "chamber.memberAgents" -}}
{{- if and .Values.dispatch.actuator.enabled .Values.dispatch.actuator.nodeAgents -}}true{{- end -}}
{{- end -}}

{{/* The NATS user of a member cluster's node agents: `chamber nats-config` names it agents-<cluster>. */}}
{{- define "chamber.memberAgentUser" -}}
{{- printf "agents-%s" . -}}
{{- end -}}

{{- define "chamber.dispatchRuns" -}}
{{- if and .Values.dispatch.enabled (eq .Values.mode "manage") (not .Values.dispatch.actuator.enabled) -}}true{{- end -}}
{{- end -}}

{{/* The clusters whose actuators get a NATS user (actuator-<cluster>): this one and dispatch.clusters. */}}
{{- define "chamber.dispatchClusters" -}}
{{- $names := list .Values.cluster.name -}}
{{- range .Values.dispatch.clusters }}{{ $names = append $names .name }}{{ end -}}
{{- join " " $names -}}
{{- end -}}

{{/* Services that talk to the Kubernetes API (and so get a token). */}}
{{- define "chamber.kubeServices" -}}
discovery health scheduler
{{- end -}}

{{/* NATS */}}
{{- define "chamber.natsHostPort" -}}
{{- if .Values.nats.deploy -}}
{{- printf "%s.%s.svc:4222" (include "chamber.component" (list . "nats")) .Release.Namespace -}}
{{- else -}}
{{- required "nats.url is required when nats.deploy is false" .Values.nats.url | trimPrefix "nats://" | trimPrefix "tls://" -}}
{{- end -}}
{{- end -}}

{{- define "chamber.natsScheme" -}}
{{- if and (not .Values.nats.deploy) (hasPrefix "tls://" .Values.nats.url) -}}tls{{- else -}}nats{{- end -}}
{{- end -}}

{{- define "chamber.natsSecret" -}}
{{- default (include "chamber.component" (list . "nats-users")) .Values.nats.auth.existingSecret -}}
{{- end -}}

{{- define "chamber.natsAgentSecret" -}}
{{- default (include "chamber.component" (list . "nats-agents")) .Values.nats.auth.existingSecret -}}
{{- end -}}

{{/* env: CHAMBER_NATS_URL for one NATS user (list $ "user"); the password never appears in the spec. */}}
{{- define "chamber.natsEnv" -}}
{{- $root := index . 0 -}}
{{- $user := index . 1 -}}
{{- if $root.Values.nats.auth.enabled }}
- name: CHAMBER_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "chamber.natsSecret" $root }}
      key: {{ $user }}
- name: CHAMBER_NATS_URL
  value: {{ printf "%s://%s:$(CHAMBER_NATS_PASSWORD)@%s" (include "chamber.natsScheme" $root) $user (include "chamber.natsHostPort" $root) | quote }}
{{- else }}
- name: CHAMBER_NATS_URL
  value: {{ printf "%s://%s" (include "chamber.natsScheme" $root) (include "chamber.natsHostPort" $root) | quote }}
{{- end }}
{{- end -}}

{{/* ClickHouse */}}
{{- define "chamber.clickhouseSecret" -}}
{{- default (include "chamber.component" (list . "clickhouse")) .Values.clickhouse.existingSecret -}}
{{- end -}}

{{- define "chamber.clickhouseEnv" -}}
{{- if .Values.clickhouse.deploy }}
- name: CHAMBER_CLICKHOUSE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "chamber.clickhouseSecret" . }}
      key: password
- name: CHAMBER_CLICKHOUSE_URL
  value: {{ printf "http://%s:$(CHAMBER_CLICKHOUSE_PASSWORD)@%s.%s.svc:8123" .Values.clickhouse.user (include "chamber.component" (list . "clickhouse")) .Release.Namespace | quote }}
- name: CHAMBER_CLICKHOUSE_SQL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "chamber.component" (list . "clickhouse") }}-sql
      key: password
- name: CHAMBER_CLICKHOUSE_SQL_URL
  value: {{ printf "http://chamber_sql:$(CHAMBER_CLICKHOUSE_SQL_PASSWORD)@%s.%s.svc:8123" (include "chamber.component" (list . "clickhouse")) .Release.Namespace | quote }}
{{- else if .Values.clickhouse.url }}
{{- if .Values.clickhouse.existingSecret }}
- name: CHAMBER_CLICKHOUSE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.clickhouse.existingSecret }}
      key: password
{{- end }}
- name: CHAMBER_CLICKHOUSE_URL
  value: {{ .Values.clickhouse.url | quote }}
{{- if .Values.clickhouse.sqlExistingSecret }}
- name: CHAMBER_CLICKHOUSE_SQL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.clickhouse.sqlExistingSecret }}
      key: password
{{- end }}
{{- with .Values.clickhouse.sqlUrl }}
- name: CHAMBER_CLICKHOUSE_SQL_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.clickhouse.cluster }}
- name: CHAMBER_CLICKHOUSE_CLUSTER
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Common env for every Chamber container. */}}
{{- define "chamber.commonEnv" -}}
- name: CHAMBER_CLUSTER
  value: {{ .Values.cluster.name | quote }}
# every process that sets up streams (services and agents) asks for the same replicas and partitions
- name: CHAMBER_NATS_REPLICAS
  value: {{ min 5 (int .Values.nats.replicas) | quote }}
- name: CHAMBER_TELEMETRY_PARTITIONS
  value: {{ int .Values.nats.telemetryPartitions | quote }}
- name: CHAMBER_MODE
  value: {{ .Values.mode | quote }}
- name: CHAMBER_HEALTH_PORT
  value: {{ .Values.healthPort | quote }}
- name: CHAMBER_DATA_DIR
  value: /var/lib/chamber
- name: CHAMBER_TELEMETRY_MAX_AGE_S
  value: {{ .Values.telemetry.maxAgeSeconds | quote }}
- name: CHAMBER_TELEMETRY_MAX_BYTES
  value: {{ .Values.telemetry.maxBytes | int64 | quote }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end -}}

{{- define "chamber.probes" -}}
livenessProbe:
  httpGet:
    path: /livez
    port: health
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: health
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- end -}}

{{/* Writable scratch on a read-only root filesystem. */}}
{{- define "chamber.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: data
  mountPath: /var/lib/chamber
{{- end -}}

{{- define "chamber.scratchVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
- name: data
  emptyDir:
    sizeLimit: 1Gi
{{- end -}}

{{/* A random secret value kept across upgrades: (list $ secretName key length). */}}
{{- define "chamber.keptSecret" -}}
{{- $root := index . 0 -}}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace (index . 1) -}}
{{- $data := dict -}}
{{- if and $existing $existing.data -}}{{- $data = $existing.data -}}{{- end -}}
{{- $value := get $data (index . 2) -}}
{{- if $value -}}{{ $value }}{{- else -}}{{ randAlphaNum (index . 3) | b64enc }}{{- end -}}
{{- end -}}

{{- define "chamber.gatewayTokenSecret" -}}
{{- default (include "chamber.component" (list . "gateway")) .Values.services.gateway.existingTokenSecret -}}
{{- end -}}

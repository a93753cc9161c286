{{/*
Names, labels, the canonical worker lanes (seed 000 §16.3) and the env blocks every role shares.
Everything that can be wrong in values fails here, with `fail`, before any manifest is written.
*/}}

{{- define "sie.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sie.fullname" -}}
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

{{/* A component's resource name; fails rather than truncating, so two names can never collide. */}}
{{- define "sie.componentName" -}}
{{- $name := printf "%s-%s" (include "sie.fullname" .root) .component -}}
{{- if gt (len $name) 63 -}}
{{- fail (printf "resource name %q is longer than 63 characters: shorten the release name, fullnameOverride or the workers key" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- define "sie.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sie.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sie.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sie.selectorLabels" . }}
app.kubernetes.io/part-of: sie
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "sie.image" -}}
{{- $image := .image -}}
{{- printf "%s:%s" $image.repository (default .root.Chart.AppVersion ($image.tag | toString)) -}}
{{- end -}}

{{/*
One lane token (seed 000 §16.3): trimmed, 1-63 characters of [A-Za-z0-9_-], lowercased. An explicit blank fails.
Call with (dict "value" V "field" "workers.x.queuePool").
*/}}
{{- define "sie.laneToken" -}}
{{- if not (kindIs "string" .value) -}}
{{- fail (printf "%s must be a string of [A-Za-z0-9_-], got %v" .field .value) -}}
{{- end -}}
{{- $token := trim .value -}}
{{- if eq $token "" -}}
{{- fail (printf "%s is blank: give a name of [A-Za-z0-9_-] (1-63 characters) or leave the key out" .field) -}}
{{- end -}}
{{- if gt (len $token) 63 -}}
{{- fail (printf "%s %q is longer than 63 characters" .field $token) -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9_-]+$" $token) -}}
{{- fail (printf "%s %q may hold only letters, digits, '_' and '-'" .field $token) -}}
{{- end -}}
{{- lower $token -}}
{{- end -}}

{{/* A whole number >= 0 (YAML numbers reach templates as float64, --set ones as int64). */}}
{{- define "sie.count" -}}
{{- if not (or (kindIs "float64" .value) (kindIs "int64" .value) (kindIs "int" .value)) -}}
{{- fail (printf "%s must be a whole number >= 0, got %v" .field .value) -}}
{{- end -}}
{{- if or (lt (float64 .value) 0.0) (ne (float64 .value) (float64 (int64 .value))) -}}
{{- fail (printf "%s must be a whole number >= 0, got %v" .field .value) -}}
{{- end -}}
{{- int64 .value -}}
{{- end -}}

{{- define "sie.workerKeys" -}}
queuePool machineProfile bundle replicas gpus resources sidecarResources nodeSelector tolerations affinity preload modelCache image autoscaling podDisruptionBudget podAnnotations extraEnv
{{- end -}}

{{/*
The workers map resolved to canonical lanes, as YAML: {key: {queuePool, machineProfile, bundle, replicas, gpus}}.
Keys are DNS-1123 labels (they name Deployments and KEDA objects); each lane tuple appears once after
normalisation; unknown worker keys fail, so a typo never silently drops a setting.
*/}}
{{- define "sie.lanes" -}}
{{- $seen := dict -}}
{{- $allowed := splitList " " (include "sie.workerKeys" .) -}}
{{- range $key, $raw := .Values.workers -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $key) -}}
{{- fail (printf "workers key %q must be a lowercase DNS-1123 label (a-z, 0-9, '-'); it names the worker Deployment" $key) -}}
{{- end -}}
{{- if not (kindIs "map" $raw) -}}
{{- fail (printf "workers.%s must be a map of worker settings" $key) -}}
{{- end -}}
{{- range $field, $_ := $raw -}}
{{- if not (has $field $allowed) -}}
{{- fail (printf "workers.%s.%s is not a worker setting (known: %s)" $key $field (join ", " $allowed)) -}}
{{- end -}}
{{- end -}}
{{- if not (hasKey $raw "machineProfile") -}}
{{- fail (printf "workers.%s.machineProfile is required (the machine profile requests name, e.g. cpu or l4)" $key) -}}
{{- end -}}
{{- $defaults := $.Values.workerDefaults -}}
{{- $queuePool := include "sie.laneToken" (dict "value" (ternary $raw.queuePool $defaults.queuePool (hasKey $raw "queuePool")) "field" (printf "workers.%s.queuePool" $key)) -}}
{{- $profile := include "sie.laneToken" (dict "value" $raw.machineProfile "field" (printf "workers.%s.machineProfile" $key)) -}}
{{- $bundle := include "sie.laneToken" (dict "value" (ternary $raw.bundle $defaults.bundle (hasKey $raw "bundle")) "field" (printf "workers.%s.bundle" $key)) -}}
{{- $lane := printf "%s/%s/%s" $queuePool $profile $bundle -}}
{{- if hasKey $seen $lane -}}
{{- fail (printf "workers.%s and workers.%s both serve the lane %s (queuePool/machineProfile/bundle after trimming and lowercasing); merge them or change one" (get $seen $lane) $key $lane) -}}
{{- end -}}
{{- $_ := set $seen $lane $key -}}
{{- $replicas := include "sie.count" (dict "value" (ternary $raw.replicas $defaults.replicas (hasKey $raw "replicas")) "field" (printf "workers.%s.replicas" $key)) -}}
{{- $gpus := include "sie.count" (dict "value" (ternary $raw.gpus $defaults.gpus (hasKey $raw "gpus")) "field" (printf "workers.%s.gpus" $key)) }}
{{ $key }}:
  queuePool: {{ $queuePool | quote }}
  machineProfile: {{ $profile | quote }}
  bundle: {{ $bundle | quote }}
  replicas: {{ $replicas }}
  gpus: {{ $gpus }}
{{- end -}}
{{- end -}}

{{/*
A worker entry over workerDefaults, as YAML. A key the entry sets replaces the default whole (resources,
nodeSelector, tolerations, preload, ...), except the settings maps autoscaling, podDisruptionBudget, modelCache
and image, which take the entry's keys over the default's one by one. Call with (dict "root" $ "key" K).
*/}}
{{- define "sie.worker" -}}
{{- $defaults := .root.Values.workerDefaults -}}
{{- $entry := get .root.Values.workers .key -}}
{{- $worker := deepCopy $defaults -}}
{{- range $field, $value := $entry -}}
{{- if and (has $field (list "autoscaling" "podDisruptionBudget" "modelCache" "image")) (kindIs "map" $value) -}}
{{- $value = include "sie.overlay" (dict "base" (get $defaults $field) "over" $value) | fromYaml -}}
{{- end -}}
{{- $_ := set $worker $field $value -}}
{{- end -}}
{{- toYaml $worker -}}
{{- end -}}

{{/* `over`'s keys set on a copy of `base` (one level; unlike mergeOverwrite, false and 0 do replace), as YAML. */}}
{{- define "sie.overlay" -}}
{{- $result := deepCopy (.base | default dict) -}}
{{- range $key, $value := .over -}}
{{- $_ := set $result $key $value -}}
{{- end -}}
{{- toYaml $result -}}
{{- end -}}

{{/* Comma-separated sorted unique values of one lane field, optionally leaving one value out. */}}
{{- define "sie.laneValues" -}}
{{- $values := list -}}
{{- range $_, $lane := .lanes -}}
{{- $value := get $lane $.field -}}
{{- if ne $value ($.except | default "") -}}
{{- $values = append $values $value -}}
{{- end -}}
{{- end -}}
{{- $values | uniq | sortAlpha | join "," -}}
{{- end -}}

{{- define "sie.natsUrl" -}}
{{- if .Values.nats.enabled -}}
{{- if .Values.nats.url -}}
{{- fail "nats.url names an external NATS: set nats.enabled=false with it, or leave it empty to use the bundled StatefulSet" -}}
{{- end -}}
{{- $name := include "sie.componentName" (dict "root" . "component" "nats") -}}
{{- $replicas := int (include "sie.natsReplicas" .) -}}
{{- if eq $replicas 1 -}}
{{- printf "nats://%s:%d" $name (int .Values.nats.service.port) -}}
{{- else -}}
{{- $urls := list -}}
{{- range $index := until $replicas -}}
{{- $urls = append $urls (printf "nats://%s-%d.%s-headless:4222" $name $index $name) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}
{{- else -}}
{{- if not .Values.nats.url -}}
{{- fail "nats.enabled=false needs nats.url (the external NATS with JetStream, e.g. nats://nats.nats.svc:4222)" -}}
{{- end -}}
{{- if not (regexMatch "^(nats|tls)://" .Values.nats.url) -}}
{{- fail (printf "nats.url %q must start with nats:// or tls://" .Values.nats.url) -}}
{{- end -}}
{{- .Values.nats.url -}}
{{- end -}}
{{- end -}}

{{/* The bundled NATS's server count: 1, or an odd number >= 3 (a JetStream cluster needs a majority). */}}
{{- define "sie.natsReplicas" -}}
{{- $replicas := .Values.nats.replicas -}}
{{- if or (not (kindIs "float64" $replicas)) (ne (float64 (int $replicas)) $replicas) (lt (int $replicas) 1) (and (gt (int $replicas) 1) (or (lt (int $replicas) 3) (eq (mod (int $replicas) 2) 0))) -}}
{{- fail (printf "nats.replicas %v must be 1 or an odd whole number >= 3 (a JetStream cluster needs a majority of its servers)" $replicas) -}}
{{- end -}}
{{- int $replicas -}}
{{- end -}}

{{/* SIE_STREAM_REPLICAS: nats.streamReplicas, else min(nats.replicas, 3) with the bundled NATS and 1 with an external one. */}}
{{- define "sie.streamReplicas" -}}
{{- $nats := .Values.nats -}}
{{- $wanted := int $nats.streamReplicas -}}
{{- if or (lt $wanted 0) (gt $wanted 5) -}}
{{- fail (printf "nats.streamReplicas %v must be 0 (follow nats.replicas) or 1..5 (JetStream's limit)" $nats.streamReplicas) -}}
{{- end -}}
{{- if $nats.enabled -}}
{{- $servers := int (include "sie.natsReplicas" .) -}}
{{- if gt $wanted $servers -}}
{{- fail (printf "nats.streamReplicas %d exceeds the %d bundled NATS servers (nats.replicas)" $wanted $servers) -}}
{{- end -}}
{{- if eq $wanted 0 -}}{{- min $servers 3 -}}{{- else -}}{{- $wanted -}}{{- end -}}
{{- else -}}
{{- max $wanted 1 -}}
{{- end -}}
{{- end -}}

{{- define "sie.gatewayUrl" -}}
{{- printf "http://%s:%d" (include "sie.componentName" (dict "root" . "component" "gateway")) (int .Values.gateway.service.port) -}}
{{- end -}}

{{- define "sie.configUrl" -}}
{{- printf "http://%s:%d" (include "sie.componentName" (dict "root" . "component" "config")) (int .Values.config.service.port) -}}
{{- end -}}

{{/* The auth Secret's name (the chart's own or auth.existingSecret), empty when no token is configured. */}}
{{- define "sie.authSecret" -}}
{{- $auth := .Values.auth -}}
{{- if not (has $auth.mode (list "none" "token")) -}}
{{- fail (printf "auth.mode %q must be none or token" $auth.mode) -}}
{{- end -}}
{{- if $auth.existingSecret -}}
{{- $auth.existingSecret -}}
{{- else if or $auth.adminToken $auth.inferenceTokens -}}
{{- include "sie.componentName" (dict "root" . "component" "auth") -}}
{{- else if eq $auth.mode "token" -}}
{{- fail "auth.mode=token needs inference tokens: set auth.inferenceTokens (and auth.adminToken) or auth.existingSecret" -}}
{{- end -}}
{{- end -}}

{{/* Env entries every SIE container gets; roles that do not read a setting are left without it. Call with (dict "root" $ "role" R). */}}
{{- define "sie.env.common" -}}
{{- $values := .root.Values -}}
- name: SIE_LOG_LEVEL
  value: {{ $values.logging.level | quote }}
- name: SIE_LOG_FORMAT
  value: {{ $values.logging.format | quote }}
- name: SIE_METRICS_ENABLED
  value: {{ $values.metrics.enabled | toString | quote }}
{{- if $values.telemetry.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $values.telemetry.otlpEndpoint | quote }}
{{- end }}
{{- if and $values.telemetry.tracing.enabled (ne .role "config") }}
{{- if not $values.telemetry.otlpEndpoint }}
{{- fail "telemetry.tracing.enabled needs telemetry.otlpEndpoint (where spans are sent)" }}
{{- end }}
- name: SIE_TRACING_ENABLED
  value: "true"
- name: SIE_TRACING_SAMPLE_RATIO
  value: {{ $values.telemetry.tracing.sampleRatio | toString | quote }}
{{- end }}
{{- end -}}

{{- define "sie.env.nats" -}}
- name: SIE_NATS_URL
  value: {{ include "sie.natsUrl" . | quote }}
{{- with .Values.nats.credentials.existingSecret }}
- name: SIE_NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.nats.credentials.userKey }}
- name: SIE_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.nats.credentials.passwordKey }}
{{- end }}
{{- end -}}

{{/* The admin token from the auth Secret as variable .name, when there is a Secret (optional: it may hold inference
tokens only). Call with (dict "root" $ "name" "SIE_ADMIN_TOKEN"). */}}
{{- define "sie.env.adminToken" -}}
{{- $secret := include "sie.authSecret" .root -}}
{{- if $secret }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .root.Values.auth.secretKeys.adminToken }}
      optional: true
{{- end }}
{{- end -}}

{{/* extraEnv: a map of setting name to value, rendered in name order. */}}
{{- define "sie.env.extra" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "sie.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext -}}
{{- end -}}

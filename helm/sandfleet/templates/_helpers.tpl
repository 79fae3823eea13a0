{{/* Names, labels and addresses every template shares. */}}

{{- define "sandfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sandfleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's object name: (dict "root" $ "component" "gateway"). */}}
{{- define "sandfleet.componentName" -}}
{{- printf "%s-%s" (include "sandfleet.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sandfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "sandfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandfleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "gateway"). */}}
{{- define "sandfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandfleet.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sandfleet.componentLabels" -}}
{{ include "sandfleet.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sandfleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "sandfleet.sandboxImage" -}}
{{- printf "%s:%s" .Values.sandbox.image.repository (default .Chart.AppVersion .Values.sandbox.image.tag) -}}
{{- end -}}

{{/*
The environment-variable prefix Kubernetes derives from a Service name (FOO-BAR -> FOO_BAR), for
$(FOO_BAR_SERVICE_HOST) expansion: the chart's Pods find each other without a DNS server.
*/}}
{{- define "sandfleet.serviceEnvPrefix" -}}
{{- . | upper | replace "-" "_" | replace "." "_" -}}
{{- end -}}

{{- define "sandfleet.gatewayURL" -}}
{{- if .Values.rl.gatewayURL -}}
{{- .Values.rl.gatewayURL -}}
{{- else -}}
{{- $prefix := include "sandfleet.serviceEnvPrefix" (include "sandfleet.componentName" (dict "root" . "component" "gateway")) -}}
{{- printf "http://$(%s_SERVICE_HOST):$(%s_SERVICE_PORT_HTTP)" $prefix $prefix -}}
{{- end -}}
{{- end -}}

{{- define "sandfleet.learnerURL" -}}
{{- if .Values.rl.actor.learnerURL -}}
{{- .Values.rl.actor.learnerURL -}}
{{- else -}}
{{- $prefix := include "sandfleet.serviceEnvPrefix" (include "sandfleet.componentName" (dict "root" . "component" "rl-learner")) -}}
{{- printf "http://$(%s_SERVICE_HOST):$(%s_SERVICE_PORT_HTTP)" $prefix $prefix -}}
{{- end -}}
{{- end -}}

{{/* The pools the pool-user Role grants "use" on. */}}
{{- define "sandfleet.accessPools" -}}
{{- $names := list -}}
{{- if .Values.poolAccess.pools -}}
{{- $names = .Values.poolAccess.pools -}}
{{- else -}}
{{- range .Values.pools }}{{ $names = append $names .name }}{{ end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{- define "sandfleet.testPool" -}}
{{- if .Values.tests.pool -}}
{{- .Values.tests.pool -}}
{{- else if .Values.pools -}}
{{- (first .Values.pools).name -}}
{{- end -}}
{{- end -}}

{{/* The sandbox Pods the operator makes: the labels of sandfleet.core.api. */}}
{{- define "sandfleet.sandboxSelector" -}}
matchLabels:
  app.kubernetes.io/managed-by: sandfleet
matchExpressions:
  - {key: sandfleet.dev/pool, operator: Exists}
{{- end -}}

{{/* Egress to the apiserver and, when enabled, DNS: NetworkPolicy egress rules. */}}
{{- define "sandfleet.apiServerEgress" -}}
- to:
  {{- range .Values.networkPolicy.apiServer.cidrs }}
    - ipBlock: {cidr: {{ . | quote }}}
  {{- end }}
  ports:
  {{- range .Values.networkPolicy.apiServer.ports }}
    - {protocol: TCP, port: {{ . }}}
  {{- end }}
{{- end -}}

{{- define "sandfleet.dnsEgress" -}}
{{- if .Values.networkPolicy.dns.enabled }}
- to:
    - namespaceSelector: {{ toJson .Values.networkPolicy.dns.namespaceSelector }}
      podSelector: {{ toJson .Values.networkPolicy.dns.podSelector }}
  ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
{{- end }}
{{- end -}}

{{/* The chart's own Pods: read-only root, so Python and friends get a writable /tmp. */}}
{{- define "sandfleet.tmpVolumeMount" -}}
- {name: tmp, mountPath: /tmp}
{{- end -}}
{{- define "sandfleet.tmpVolume" -}}
- {name: tmp, emptyDir: {sizeLimit: 256Mi}}
{{- end -}}

{{/* Values that pass the schema but do not fit together: one message saying what to set. */}}
{{- define "sandfleet.checks" -}}
{{- if and .Values.gateway.enabled (eq .Values.gateway.auth "static") (not .Values.gateway.staticTokens.secretName) -}}
{{- fail "gateway.auth=static needs gateway.staticTokens.secretName: a Secret whose key holds lines `TOKEN NAME [POOLS]`" -}}
{{- end -}}
{{- if and .Values.tests.enabled .Values.gateway.enabled (not (include "sandfleet.testPool" .)) -}}
{{- fail "tests.enabled needs a pool: set tests.pool or list one under pools (or tests.enabled=false)" -}}
{{- end -}}
{{- if and .Values.tests.enabled .Values.gateway.enabled (eq .Values.gateway.auth "static") (not .Values.tests.tokenSecret.name) -}}
{{- fail "tests with gateway.auth=static need tests.tokenSecret.name: a Secret holding a token the gateway accepts (or tests.enabled=false)" -}}
{{- end -}}
{{- if and .Values.rl.enabled (not .Values.gateway.enabled) (not .Values.rl.gatewayURL) -}}
{{- fail "rl.enabled without the chart's gateway needs rl.gatewayURL" -}}
{{- end -}}
{{- end -}}

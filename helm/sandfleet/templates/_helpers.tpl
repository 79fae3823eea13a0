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

{{- define "sandfleet.agentBundleImage" -}}
{{- printf "%s:%s" .Values.sandbox.agentBundle.image.repository (default .Chart.AppVersion .Values.sandbox.agentBundle.image.tag) -}}
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

{{/* Every SandboxPool the chart renders: `pools`, and the RL tasks' pool when the RL Deployments
  are on and it names an image. A JSON list (read back with fromJsonArray). */}}
{{- define "sandfleet.pools" -}}
{{- $pools := .Values.pools | default list -}}
{{- if and .Values.rl.enabled .Values.rl.tasksPool.image -}}
{{- $pools = append $pools .Values.rl.tasksPool -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $pools -}}
{{- if hasKey $seen .name -}}
{{- fail (printf "two pools are named %q (rl.tasksPool adds one when rl.enabled): rename one, or set rl.tasksPool.image to \"\" and rl.pool to the pool of yours that serves the tasks" .name) -}}
{{- end -}}
{{- $_ := set $seen .name true -}}
{{- end -}}
{{- toJson $pools -}}
{{- end -}}

{{/* The pool the RL actors lease from. */}}
{{- define "sandfleet.rlPool" -}}
{{- .Values.rl.pool | default .Values.rl.tasksPool.name -}}
{{- end -}}

{{/* The pools the pool-user Role grants "use" on. */}}
{{- define "sandfleet.accessPools" -}}
{{- $names := list -}}
{{- if .Values.poolAccess.pools -}}
{{- $names = .Values.poolAccess.pools -}}
{{- else -}}
{{- range (include "sandfleet.pools" . | fromJsonArray) }}{{ $names = append $names .name }}{{ end -}}
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

{{/*
The apiserver's addresses as CIDRs (JSON list): the values', else the `kubernetes` Service's
EndpointSlice looked up in the cluster; empty offline (`helm template`), where nothing is looked up.
*/}}
{{- define "sandfleet.apiServerCIDRs" -}}
{{- $cidrs := list -}}
{{- if .Values.networkPolicy.apiServer.cidrs -}}
{{- $cidrs = .Values.networkPolicy.apiServer.cidrs -}}
{{- else -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" | default dict -}}
{{- range ($slice.endpoints | default list) -}}
{{- range (.addresses | default list) -}}
{{- $cidrs = append $cidrs (printf "%s/%s" . (ternary "128" "32" (contains ":" .))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $cidrs -}}
{{- end -}}

{{/* The apiserver's ports: the values', and the EndpointSlice's when the addresses come from it. */}}
{{- define "sandfleet.apiServerPorts" -}}
{{- $ports := list -}}
{{- range .Values.networkPolicy.apiServer.ports }}{{ $ports = append $ports (int .) }}{{ end -}}
{{- if not .Values.networkPolicy.apiServer.cidrs -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" | default dict -}}
{{- range ($slice.ports | default list) }}{{ $ports = append $ports (int .port) }}{{ end -}}
{{- end -}}
{{- toJson ($ports | uniq) -}}
{{- end -}}

{{/*
Egress to the apiserver: NetworkPolicy egress rules, none when its addresses are unknown (a rule
without peers would allow every destination).
*/}}
{{- define "sandfleet.apiServerEgress" -}}
{{- $cidrs := include "sandfleet.apiServerCIDRs" . | fromJsonArray -}}
{{- if $cidrs }}
- to:
  {{- range $cidrs }}
    - ipBlock: {cidr: {{ . | quote }}}
  {{- end }}
  ports:
  {{- range (include "sandfleet.apiServerPorts" . | fromJsonArray) }}
    - {protocol: TCP, port: {{ . }}}
  {{- end }}
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

{{/* The Secret holding the fleet key (sandbox agents' tokens derive from it). */}}
{{- define "sandfleet.agentKeySecret" -}}
{{- .Values.agentKey.existingSecret | default (include "sandfleet.componentName" (dict "root" . "component" "agent-key")) -}}
{{- end -}}

{{- define "sandfleet.agentKeyPath" -}}
{{- printf "/etc/sandfleet/agent-key/%s" .Values.agentKey.key -}}
{{- end -}}

{{/* The fleet key mounted read-only into the operator and the gateway. */}}
{{- define "sandfleet.agentKeyVolumeMount" -}}
- {name: agent-key, mountPath: /etc/sandfleet/agent-key, readOnly: true}
{{- end -}}
{{- define "sandfleet.agentKeyVolume" -}}
- name: agent-key
  secret:
    secretName: {{ include "sandfleet.agentKeySecret" . }}
    defaultMode: 0440
    items: [{key: {{ .Values.agentKey.key }}, path: {{ .Values.agentKey.key }}}]
{{- end -}}

{{/* The RuntimeClasses pools may name (JSON list): runtimeClass.allowed, else runtimeClass.name. */}}
{{- define "sandfleet.allowedRuntimeClasses" -}}
{{- toJson (.Values.runtimeClass.allowed | default (list .Values.runtimeClass.name)) -}}
{{- end -}}

{{/* The gateway's ServiceAccount as the apiserver names it (admission policies match on it). */}}
{{- define "sandfleet.gatewayUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "sandfleet.componentName" (dict "root" . "component" "gateway")) -}}
{{- end -}}

{{/*
The release namespace must carry the Pod Security labels of values podSecurity (the chart cannot
label a namespace it does not own). Looked up at install and upgrade; offline renders skip it.
*/}}
{{- define "sandfleet.checkNamespace" -}}
{{- if .Values.podSecurity.checkNamespace -}}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace | default dict -}}
{{- /* Offline every lookup is empty; online `default` always exists, so a missing namespace means
  helm is about to create it (--create-namespace) without the labels. */ -}}
{{- if and (not $ns) (lookup "v1" "Namespace" "" "default") -}}
{{- fail (printf "namespace %s does not exist yet: create and label it first (kubectl create namespace %s; kubectl label namespace %s pod-security.kubernetes.io/enforce=%s pod-security.kubernetes.io/warn=%s pod-security.kubernetes.io/audit=%s), then install without --create-namespace" .Release.Namespace .Release.Namespace .Release.Namespace .Values.podSecurity.enforce .Values.podSecurity.warn .Values.podSecurity.audit) -}}
{{- end -}}
{{- if $ns -}}
{{- $labels := (($ns.metadata | default dict).labels | default dict) -}}
{{- $wrong := list -}}
{{- $want := list -}}
{{- range $mode := list "enforce" "warn" "audit" -}}
{{- $key := printf "pod-security.kubernetes.io/%s" $mode -}}
{{- $level := index $.Values.podSecurity $mode -}}
{{- $want = append $want (printf "%s=%s" $key $level) -}}
{{- if ne (index $labels $key | default "") $level -}}
{{- $wrong = append $wrong (printf "%s is %q, want %q" $key (index $labels $key | default "") $level) -}}
{{- end -}}
{{- end -}}
{{- if $wrong -}}
{{- fail (printf "namespace %s lacks the Pod Security labels sandfleet needs (%s). Label it: kubectl label namespace %s --overwrite %s (or podSecurity.checkNamespace=false if something else enforces Pod Security there)" .Release.Namespace (join "; " $wrong) .Release.Namespace (join " " $want)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Values that pass the schema but do not fit together: one message saying what to set. */}}
{{- define "sandfleet.checks" -}}
{{- include "sandfleet.checkNamespace" . -}}
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

{{/* What a gateway does in the namespace it serves (gateway.yaml; a fleet gateway's account in a
member, fleet-member.yaml): the Role's rules. */}}
{{- define "sandfleet.gatewayRules" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
# No delete, no create, no status, no exec, no ephemeral containers: the operator makes and ends
# sandboxes; the gateway only marks leases on them.
- apiGroups: [sandfleet.dev]
  resources: [sandboxpools]
  verbs: [get, list, watch]
- apiGroups: [sandfleet.dev]
  resources: [sandboxprewarms]
  verbs: [create, patch]
# The lease ledgers (docs/gateway.md): read by a watch, created once per shard, then patched in
# batches, each patch conditional on the ledger's resourceVersion. Never deleted.
- apiGroups: [sandfleet.dev]
  resources: [sandboxledgers]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, update]
# Each replica renews a Lease of its own so the replicas find each other and hand out disjoint
# shares of the warm Pods first (gateway/kube_members.py); names are generated, so the admission
# policy confines these writes to sandfleet-gateway-* (never the operator's leader Lease).
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, patch, delete]
{{- end -}}

{{/* The fleet gateway's account in this member cluster (fleet-member.yaml), as the apiserver names it. */}}
{{- define "sandfleet.fleetGatewayUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "sandfleet.componentName" (dict "root" . "component" "fleet-gateway")) -}}
{{- end -}}

{{/* The chart's name, and the objects' name: the release's name when it already contains the chart's. */}}
{{- define "ddiskqos-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ddiskqos-agent.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Selector labels: the base's app.kubernetes.io/name, and the release (two releases never share pods). */}}
{{- define "ddiskqos-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ddiskqos-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ddiskqos-agent.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ddiskqos-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The metrics port: the port of config.metrics.listen (one source for the container port, the probes, the
     scrape annotation, the NetworkPolicy and the PodMonitor). */}}
{{- define "ddiskqos-agent.metricsPort" -}}
{{- $listen := .Values.config.metrics.listen | toString }}
{{- $port := regexFind "[0-9]+$" $listen }}
{{- if not $port }}{{ fail (printf "values.yaml config.metrics.listen: %q has no port" $listen) }}{{ end }}
{{- $port }}
{{- end }}

{{/* One TOML value: strings (JSON escapes are TOML's), booleans, integers (Helm reads numbers as float64;
     integral ones are written without a fraction, the agent's integer settings refuse 1000.0), arrays and
     inline tables (keys quoted). */}}
{{- define "ddiskqos-agent.tomlValue" -}}
{{- $v := . }}
{{- if kindIs "string" $v }}{{ toJson $v }}
{{- else if kindIs "bool" $v }}{{ $v }}
{{- else if kindIs "float64" $v }}{{ if eq $v (float64 (int64 $v)) }}{{ int64 $v }}{{ else }}{{ $v }}{{ end }}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) }}{{ $v }}
{{- else if kindIs "slice" $v }}[{{ range $i, $e := $v }}{{ if $i }}, {{ end }}{{ include "ddiskqos-agent.tomlValue" $e }}{{ end }}]
{{- else if kindIs "map" $v }}{{ "{" }}{{ range $i, $k := keys $v | sortAlpha }}{{ if $i }},{{ end }} {{ toJson $k }} = {{ include "ddiskqos-agent.tomlValue" (get $v $k) }}{{ end }}{{ if $v }} {{ end }}{{ "}" }}
{{- else }}{{ fail (printf "values.yaml config: cannot write %v (%s) as TOML" $v (kindOf $v)) }}
{{- end }}
{{- end }}

{{/* agent.toml from .Values.config: top-level settings, then one [section] per map. The release's namespace is
     added to [policy] exclude_namespaces (the agent never weights its own pods). */}}
{{- define "ddiskqos-agent.agentToml" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $policy := get $cfg "policy" | default dict }}
{{- $exclude := get $policy "exclude_namespaces" | default (list "kube-system") }}
{{- if not (has .Release.Namespace $exclude) }}{{ $exclude = append $exclude .Release.Namespace }}{{ end }}
{{- $_ := set $policy "exclude_namespaces" $exclude }}
{{- $_ := set $cfg "policy" $policy }}
{{- if and (eq (get $cfg "actuator" | default "auto") "systemd") (not .Values.systemdDriver.enabled) }}
{{- fail "values.yaml: config.actuator = \"systemd\" needs systemdDriver.enabled = true (the host's D-Bus socket and /run/systemd/system mounted)" }}
{{- end -}}
# agent.toml rendered by the Helm chart deploy/helm/ddiskqos-agent from its values' `config` (every setting with
# its default and meaning: deploy/agent.toml). The release's namespace is in [policy] exclude_namespaces.
{{- range $k := keys $cfg | sortAlpha }}
{{- $v := get $cfg $k }}
{{- if not (kindIs "map" $v) }}
{{ $k }} = {{ include "ddiskqos-agent.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k := keys $cfg | sortAlpha }}
{{- $v := get $cfg $k }}
{{- if kindIs "map" $v }}

[{{ $k }}]
{{- range $kk := keys $v | sortAlpha }}
{{ $kk }} = {{ include "ddiskqos-agent.tomlValue" (get $v $kk) }}
{{- end }}
{{- end }}
{{- end }}
{{ end }}

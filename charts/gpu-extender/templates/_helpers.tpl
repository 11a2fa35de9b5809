{{/*
Labels. The selectors are those of manifests/ and never change (a Deployment's selector is immutable); every
object also carries Helm's own labels.
*/}}

{{/* What Helm adds to every object's labels: who manages it, and which release and chart made it. */}}
{{- define "gpu-extender.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The extender's pods, as its Deployment, Service, PodDisruptionBudget and NetworkPolicy select them. */}}
{{- define "gpu-extender.extender.selectorLabels" -}}
app.kubernetes.io/name: gpu-extender
app.kubernetes.io/component: extender
{{- end }}

{{/* The labels of the extender's pods. */}}
{{- define "gpu-extender.extender.podLabels" -}}
{{ include "gpu-extender.extender.selectorLabels" . }}
app.kubernetes.io/part-of: gpu-extender
{{- end }}

{{/* The extender's Deployment, Service, PodDisruptionBudget, NetworkPolicy and monitors. */}}
{{- define "gpu-extender.extender.labels" -}}
{{ include "gpu-extender.extender.podLabels" . }}
{{ include "gpu-extender.helmLabels" . }}
{{- end }}

{{/* The extender's ServiceAccount and RBAC (no component, as in manifests/base/rbac.yaml). */}}
{{- define "gpu-extender.extender.identityLabels" -}}
app.kubernetes.io/name: gpu-extender
app.kubernetes.io/part-of: gpu-extender
{{ include "gpu-extender.helmLabels" . }}
{{- end }}

{{/* gpu-scheduler's pods, as its Deployment and PodDisruptionBudget select them. */}}
{{- define "gpu-extender.scheduler.selectorLabels" -}}
app.kubernetes.io/name: gpu-scheduler
app.kubernetes.io/component: scheduler
{{- end }}

{{- define "gpu-extender.scheduler.podLabels" -}}
{{ include "gpu-extender.scheduler.selectorLabels" . }}
app.kubernetes.io/part-of: gpu-extender
{{- end }}

{{- define "gpu-extender.scheduler.labels" -}}
{{ include "gpu-extender.scheduler.podLabels" . }}
{{ include "gpu-extender.helmLabels" . }}
{{- end }}

{{/* gpu-scheduler's ServiceAccount, RBAC and ConfigMap (no component, as in manifests/second-scheduler/). */}}
{{- define "gpu-extender.scheduler.identityLabels" -}}
app.kubernetes.io/name: gpu-scheduler
app.kubernetes.io/part-of: gpu-extender
{{ include "gpu-extender.helmLabels" . }}
{{- end }}

{{/* The extender's image: the chart's appVersion unless a tag is given. */}}
{{- define "gpu-extender.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* What kube-scheduler calls: the default --url of `extender scheduler-config`, in the release's namespace. */}}
{{- define "gpu-extender.url" -}}
https://gpu-extender.{{ .Release.Namespace }}.svc:443
{{- end }}

{{/*
The name the second scheduler answers to: secondScheduler.schedulerName, else gpu-scheduler, or with protocol hami
hami-scheduler, the name HAMi's admission webhook gives GPU pods (manifests/hami/second-scheduler/).
*/}}
{{- define "gpu-extender.schedulerName" -}}
{{- if .Values.secondScheduler.schedulerName -}}
{{ .Values.secondScheduler.schedulerName }}
{{- else if eq .Values.protocol "hami" -}}
hami-scheduler
{{- else -}}
gpu-scheduler
{{- end }}
{{- end }}

{{/*
"true" when the extender places by fill, HAMi's way (protocol hami with a default scheduler policy set), else
empty: the extender's flags and the second scheduler's configuration both follow it.
*/}}
{{- define "gpu-extender.placesByFill" -}}
{{- $policy := .Values.hami.defaultSchedulerPolicy }}
{{- if and (eq .Values.protocol "hami") (or $policy.nodeSchedulerPolicy $policy.gpuSchedulerPolicy) -}}
true
{{- end }}
{{- end }}

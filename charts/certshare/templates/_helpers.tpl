{{/* The labels of every object: kustomize's `labels` in manifests/injector, and commonLabels. */}}
{{- define "certshare.labels" -}}
app.kubernetes.io/part-of: certshare
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The injector's image: the tag defaults to the chart's appVersion. */}}
{{- define "certshare.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The name of the chart's objects: the release's, or the app's in sidecar mode. */}}
{{- define "idem.fullname" -}}
{{- if eq .Values.mode "sidecar" -}}
{{- .Values.app.name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "idem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "idem.fullname" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "idem.labels" -}}
{{ include "idem.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* idem.yaml: .Values.config with the fields the chart owns. */}}
{{- define "idem.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- if and (eq .Values.mode "sidecar") (not $cfg.upstream) -}}
{{- $_ := set $cfg "upstream" (printf "http://127.0.0.1:%d" (int .Values.app.port)) -}}
{{- end -}}
{{- if not $cfg.upstream -}}
{{- fail "config.upstream is required in standalone mode: the URL of the app's Service" -}}
{{- end -}}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%d" (int .Values.ports.proxy)) -}}
{{- $_ := set $cfg "admin" (printf "0.0.0.0:%d" (int .Values.ports.admin)) -}}
{{- range $field := list "scope_secret_file" "admin_token_file" "encryption_key_file" -}}
{{- with index $.Values.secret $field -}}
{{- $_ := set $cfg $field (printf "/etc/idem/secrets/%s" .) -}}
{{- end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- define "idem.securityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The idem container; the sidecar adds restartPolicy and a startup probe. */}}
{{- define "idem.container" -}}
- name: idem
  image: {{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if eq .Values.mode "sidecar" }}
  restartPolicy: Always
  {{- end }}
  args: ["--config", "/etc/idem/config/idem.yaml"]
  env:
    {{- with .Values.secret.store }}
    - name: IDEM_STORE_FILE
      value: {{ printf "/etc/idem/secrets/%s" . | quote }}
    {{- end }}
    - name: GOMEMLIMIT
      valueFrom:
        resourceFieldRef:
          resource: limits.memory
  ports:
    - name: http
      containerPort: {{ .Values.ports.proxy }}
    - name: admin
      containerPort: {{ .Values.ports.admin }}
  {{- if eq .Values.mode "sidecar" }}
  startupProbe:
    httpGet:
      path: /livez
      port: admin
    periodSeconds: 1
    failureThreshold: 30
  {{- end }}
  livenessProbe:
    httpGet:
      path: /livez
      port: admin
    periodSeconds: 10
    failureThreshold: 3
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    periodSeconds: 5
    failureThreshold: 2
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "idem.securityContext" . | nindent 4 }}
  volumeMounts:
    - name: idem-config
      mountPath: /etc/idem/config
      readOnly: true
    - name: idem-secrets
      mountPath: /etc/idem/secrets
      readOnly: true
{{- end -}}

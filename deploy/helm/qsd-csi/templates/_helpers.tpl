{{/* SPDX-License-Identifier: Apache-2.0 */}}
{{/* Shared pieces of the qsd-csi templates. */}}

{{/* The plugin image, repository:tag (tag defaults to appVersion). */}}
{{- define "qsd-csi.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* A sidecar's image: include "qsd-csi.sidecar" .Values.sidecars.resizer */}}
{{- define "qsd-csi.sidecar" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}

{{/* The labels every object carries (as deploy/kubernetes). */}}
{{- define "qsd-csi.labels" -}}
app.kubernetes.io/part-of: qsd-csi
{{- end -}}

{{/* The driver name: CSIDriver, --driver-name, classes' provisioner/driver. */}}
{{- define "qsd-csi.driver" -}}
qsd.csi.qsd-csi.dev
{{- end -}}

{{/* The RBD StorageClasses' driver name: the plugin's --rbd-driver-name
     (its second socket), the RBD CSIDriver, deploy/examples/rbd.yaml. */}}
{{- define "qsd-csi.rbdDriver" -}}
rbd.qsd-csi.dev
{{- end -}}

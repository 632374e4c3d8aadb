{{/* The chart's name, or nameOverride (the app.kubernetes.io/name label). */}}
{{- define "ferry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object's name: fullnameOverride, else the release name when it
already contains the chart's name (release "ferry": ferry-peer, not ferry-ferry-peer),
else <release>-<name>. 63 characters at most (a DNS label).
*/}}
{{- define "ferry.fullname" -}}
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

{{/* <fullname>-<suffix>, kept a DNS label (dict: root, suffix). */}}
{{- define "ferry.componentName" -}}
{{- printf "%s-%s" (include "ferry.fullname" .root) .suffix | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The helm.sh/chart label: <chart>-<version>, `+` not allowed in label values. */}}
{{- define "ferry.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels (Kubernetes' recommended app.kubernetes.io/* and Helm's helm.sh/chart). */}}
{{- define "ferry.labels" -}}
helm.sh/chart: {{ include "ferry.chart" . }}
app.kubernetes.io/name: {{ include "ferry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ferry
{{- end }}

{{/*
Selector labels of one component (dict: root, component). Release and component only,
as in the chart's first version: a Deployment's selector is immutable, so adding the name
label would break upgrades.
*/}}
{{- define "ferry.selectorLabels" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "ferry.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* A non-root, read-only container. */}}
{{- define "ferry.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Kafka settings of a client whose KafkaUser is `user` (dict: root, user). */}}
{{- define "ferry.kafkaEnv" -}}
- name: FERRY_BROKERS
  value: {{ .root.Values.kafka.bootstrap | quote }}
- name: FERRY_TOPIC_PREFIX
  value: {{ .root.Values.kafka.topicPrefix | quote }}
- name: FERRY_KAFKA_SECURITY_PROTOCOL
  value: {{ .root.Values.kafka.securityProtocol | quote }}
- name: FERRY_KAFKA_SASL_MECHANISM
  value: {{ .root.Values.kafka.saslMechanism | quote }}
- name: FERRY_KAFKA_SASL_USERNAME
  value: {{ .user | quote }}
- name: FERRY_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "ferry.userSecret" . }}
      key: password
- name: FERRY_KAFKA_SSL_CA_LOCATION
  value: /etc/ferry/kafka-ca/ca.crt
{{- end }}

{{/*
The Secret holding KafkaUser `user`'s password (dict: root, user): Strimzi's User
Operator names it after the KafkaUser, behind the Kafka resource's
entityOperator.userOperator.secretPrefix (kafka.userSecretPrefix here).
*/}}
{{- define "ferry.userSecret" -}}
{{ .root.Values.kafka.userSecretPrefix }}{{ .user }}
{{- end }}

{{/* The KafkaUsers of what is enabled, one a line: the dashboard's, each worker's. */}}
{{- define "ferry.kafkaUsers" -}}
{{- if .Values.dashboard.enabled }}
ferry-dashboard
{{- end }}
{{- range $kind, $w := .Values.workers }}
{{- if $w.enabled }}
ferry-worker-{{ $kind }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ferry.kafkaVolume" -}}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.caSecret }}
    items: [{key: ca.crt, path: ca.crt}]
- name: tmp
  emptyDir: {}
{{- end }}

{{- define "ferry.kafkaMounts" -}}
- name: kafka-ca
  mountPath: /etc/ferry/kafka-ca
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end }}

{{/*
The hub API rules of each worker: only what it touches. Managed clusters are reached
through their kubeconfig Secrets (Cluster API's <cluster>-kubeconfig), never cluster-admin.
No ClusterRole grants Secrets: those come through Roles in the cluster namespaces
("ferry.kubeconfigVerbs") and, for deploy, in the app namespaces that are listed.
*/}}
{{- define "ferry.rules" -}}
{{- $watchClusters := dict "apiGroups" (list "cluster.open-cluster-management.io") "resources" (list "managedclusters") "verbs" (list "get" "list" "watch") -}}
{{- if eq . "create-cluster" }}
- apiGroups: [cluster.x-k8s.io]
  resources: [clusters, machinedeployments, clusterclasses]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [cluster.x-k8s.io]
  resources: [machines]
  verbs: [get, list, watch]
- apiGroups: [controlplane.cluster.x-k8s.io]
  resources: [kubeadmcontrolplanes, kthreescontrolplanes]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [bootstrap.cluster.x-k8s.io]
  resources: [kubeadmconfigtemplates, kthreesconfigtemplates]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [infrastructure.cluster.x-k8s.io]
  resources: [openstackclusters, openstackmachinetemplates, dockerclusters, dockermachinetemplates]
  verbs: [get, list, watch, create, patch, delete]
# The hub's address and CA for clusteradm join: kube-public/cluster-info, and no other
# ConfigMap (ferry_kube::ocm_join; the worker writes none on the hub).
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [cluster-info]
  verbs: [get]
# A revert removes the namespace the create made (and only that one).
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, create, patch, delete]
# The klusterlet creates the ManagedCluster; Ferry accepts, labels and deletes it.
- apiGroups: [cluster.open-cluster-management.io]
  resources: [managedclusters]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [cluster.open-cluster-management.io]
  resources: [managedclustersets]
  verbs: [get, list, watch]
# clusteradm join: a bootstrap token of OCM's bootstrap ServiceAccount (clusteradm
# pkg/helpers/client.go GetBootstrapTokenFromSA); the hub's address and CA come from
# kube-public/cluster-info (read above).
- apiGroups: [""]
  resources: [serviceaccounts/token]
  resourceNames: [agent-registration-bootstrap]
  verbs: [create]
# clusteradm accept: the agent's CSR approved (the approval subresource and `approve` on
# the signer, kubernetes pkg/apis/certificates: approval needs both).
- apiGroups: [certificates.k8s.io]
  resources: [certificatesigningrequests]
  verbs: [get, list]
- apiGroups: [certificates.k8s.io]
  resources: [certificatesigningrequests/approval]
  verbs: [update]
- apiGroups: [certificates.k8s.io]
  resources: [signers]
  resourceNames: [kubernetes.io/kube-apiserver-client]
  verbs: [approve]
# OCM's ManagedCluster webhook authorizes accepting a cluster and putting it into a set
# separately (ocm pkg/registration/webhook/v1/managedcluster_validating.go).
- apiGroups: [register.open-cluster-management.io]
  resources: [managedclusters/accept]
  verbs: [update]
- apiGroups: [cluster.open-cluster-management.io]
  resources: [managedclustersets/join]
  verbs: [create]
{{- else if eq . "peer" }}
- {{ toYaml $watchClusters | nindent 2 | trim }}
# Submariner: the cluster-set label of the pair (restored on revert); OCM's webhook
# wants `join` on the old and the new set for that.
- apiGroups: [cluster.open-cluster-management.io]
  resources: [managedclusters]
  verbs: [patch]
- apiGroups: [cluster.open-cluster-management.io]
  resources: [managedclustersets/join]
  verbs: [create]
- apiGroups: [cluster.open-cluster-management.io]
  resources: [managedclustersets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [addon.open-cluster-management.io]
  resources: [clustermanagementaddons]
  verbs: [get]
- apiGroups: [addon.open-cluster-management.io]
  resources: [managedclusteraddons]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [submarineraddon.open-cluster-management.io]
  resources: [submarinerconfigs]
  verbs: [get, list, watch, create, patch, delete]
# Submariner: the set's Broker in its broker namespace (which the add-on makes and the
# worker waits for). ManifestWorks stay out of reach: the add-on's carry Secrets.
- apiGroups: [submariner.io]
  resources: [brokers]
  verbs: [get, create, delete]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
{{- else if eq . "offload" }}
- {{ toYaml $watchClusters | nindent 2 | trim }}
{{- else if eq . "deploy" }}
- {{ toYaml $watchClusters | nindent 2 | trim }}
- apiGroups: [work.open-cluster-management.io]
  resources: [manifestworks]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [cluster.open-cluster-management.io]
  resources: [placements]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [cluster.open-cluster-management.io]
  resources: [managedclustersetbindings]
  verbs: [get, list]
- apiGroups: [cluster.open-cluster-management.io]
  resources: [placementdecisions, addonplacementscores]
  verbs: [get, list, watch]
# The app record (ConfigMap ferry-app-<name>) and the app's namespace on the hub.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, create, patch]
{{- else if eq . "score" }}
- {{ toYaml $watchClusters | nindent 2 | trim }}
- apiGroups: [cluster.open-cluster-management.io]
  resources: [addonplacementscores, addonplacementscores/status]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [work.open-cluster-management.io]
  resources: [manifestworks]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
{{- end }}
{{- end }}

{{/*
The verbs on Secrets a worker has in each cluster namespace (values clusterNamespaces),
granted by a Role there. Every worker reads a cluster's kubeconfig Secret by name
(ferry_kube::Clusters: one get per cluster namespace, Secrets elsewhere are never read);
create-cluster also waits for the one its cluster's providers write (a watch: list,
watch). No worker writes a Secret on the hub: create-cluster's OCM bootstrap kubeconfig
goes to the cluster through the cluster's own kubeconfig.
*/}}
{{- define "ferry.kubeconfigVerbs" -}}
{{- if eq . "create-cluster" -}}
[get, list, watch]
{{- else -}}
[get]
{{- end -}}
{{- end }}

{{/* A namespace name (DNS-1123 label), or the chart fails naming the value (dict: ns, what). */}}
{{- define "ferry.namespace" -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" (toString .ns)) -}}
{{- fail (printf "%s: %q is not a namespace name" .what (toString .ns)) -}}
{{- end -}}
{{ .ns }}
{{- end }}

{{/*
A copy of Secret `name` from namespace `from` into the release namespace, keys `keys` only
(dict: root, from, name, keys, what). Fails naming the Secret when it cannot be read.
*/}}
{{- define "ferry.copySecret" -}}
{{- $src := lookup "v1" "Secret" .from .name }}
{{- if not $src }}
{{- fail (printf "%s, Secret %s/%s, cannot be read: it does not exist yet, helm may not get Secrets there, or this is an offline render (helm template, --dry-run, Argo CD), where lookup finds nothing. Install with access to %s, or leave the namespace value empty and put the Secret into %s yourself (docs/OPERATIONS.md)" .what .from .name .from .root.Release.Namespace) }}
{{- end }}
{{- $data := $src.data | default dict }}
---
apiVersion: v1
kind: Secret
metadata:
  name: {{ .name }}
  labels:
    {{- include "ferry.labels" .root | nindent 4 }}
  annotations:
    # Copied at install/upgrade; a password Strimzi regenerates needs a `helm upgrade`.
    ferry.io/copied-from: {{ printf "%s/%s" .from .name }}
type: Opaque
data:
  {{- range $k := .keys }}
  {{- if not (hasKey $data $k) }}
  {{- fail (printf "%s, Secret %s/%s, has no key %s" $.what $.from $.name $k) }}
  {{- end }}
  {{ $k }}: {{ index $data $k }}
  {{- end }}
{{- end }}

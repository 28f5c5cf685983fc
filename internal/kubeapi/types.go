// Package kubeapi is agentbox's Kubernetes API: the cluster-scoped custom
// resources through which cluster admins write roles and bindings with
// kubectl (AgentRole, AgentRoleBinding), and the per-node object the node
// agent (`agentbox sync`) reports on (AgentNodePolicy). The spec types are
// the policy loader's own (internal/policy), so the API and the files on
// disk cannot drift; the CRDs are generated from these types by
// hack/crds.sh (controller-gen) into examples/kubernetes/crds.yaml.
//
// The kinds are Agent* so that `kubectl get roles` stays RBAC's; files on
// disk keep kind Role and RoleBinding.
//
// +groupName=agentbox.dev
// +versionName=v1
package kubeapi

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"agentbox.dev/agentbox/internal/policy"
)

// Group, version and resources.
const (
	Group   = "agentbox.dev"
	Version = "v1"

	RolesResource     = "agentroles"
	BindingsResource  = "agentrolebindings"
	NodesResource     = "agentnodepolicies"
	KindRole          = "AgentRole"
	KindRoleBinding   = "AgentRoleBinding"
	KindNodePolicy    = "AgentNodePolicy"
	ConditionAccepted = "Accepted"
)

// AgentRole is what an agent claiming the role may do: the spec of a
// policy file's Role. Its name is the role's name.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=arole,categories=agentbox
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Inherits",type=string,JSONPath=`.spec.inherits`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.activeNodes`,description="nodes enforcing this generation"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$')",message="a role's name is lower-case letters, digits and '-', at most 63"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.inherits) || self.spec.inherits != self.metadata.name",message="a role cannot inherit from itself"
type AgentRole struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   policy.RoleSpec `json:"spec"`
	Status ObjectStatus    `json:"status,omitempty"`
}

// AgentRoleBinding says who may claim a role: the spec of a policy file's
// RoleBinding.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=arb,categories=agentbox
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Role",type=string,JSONPath=`.spec.role`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.activeNodes`,description="nodes enforcing this generation"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$')",message="a binding's name is lower-case letters, digits and '-', at most 63"
type AgentRoleBinding struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   policy.RoleBindingSpec `json:"spec"`
	Status ObjectStatus           `json:"status,omitempty"`
}

// ObjectStatus is what the node agents say of a role or binding.
type ObjectStatus struct {
	// ObservedGeneration is the generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Accepted is True when the object, with every other
	// policy object and the node's own files, loads; False names the
	// file, line and field as `agentbox policy validate` prints them.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ActiveNodes counts the nodes whose enforced snapshot holds this
	// object's current generation (from the AgentNodePolicy objects).
	// +optional
	ActiveNodes int32 `json:"activeNodes"`
}

// AgentNodePolicy is one node's report: the policy snapshot it enforces.
// Its name is the node's name; the node's agent alone writes it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=anp,categories=agentbox
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Snapshot",type=string,JSONPath=`.status.digest`
// +kubebuilder:printcolumn:name="Applied",type=string,JSONPath=`.status.conditions[?(@.type=="Applied")].status`
// +kubebuilder:printcolumn:name="Since",type=date,JSONPath=`.status.appliedAt`
type AgentNodePolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Status NodeStatus `json:"status,omitempty"`
}

// NodeStatus is the snapshot a node enforces.
type NodeStatus struct {
	// Digest is the sha256 of the snapshot file the node enforces.
	// +optional
	Digest string `json:"digest,omitempty"`
	// AppliedAt is when that snapshot was written.
	// +optional
	AppliedAt *metav1.Time `json:"appliedAt,omitempty"`
	// Objects are the roles and bindings in it, with their generations.
	// +optional
	Objects []ObjectRef `json:"objects,omitempty"`
	// Conditions: Applied is False while the newest set of objects is
	// refused (the node keeps enforcing Digest).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Refused are the objects of the newest set this node's loader
	// refused, at their generations, with its findings. The broker, not the
	// nodes, writes each object's own status from every node's report.
	// +optional
	Refused []ObjectProblems `json:"refused,omitempty"`
}

// ObjectProblems are a node loader's findings on one object.
type ObjectProblems struct {
	ObjectRef `json:",inline"`
	// Problems as `agentbox policy validate` prints them.
	Problems []string `json:"problems"`
}

// ObjectRef names a role or binding at a generation.
type ObjectRef struct {
	// Kind is AgentRole or AgentRoleBinding.
	Kind string `json:"kind"`
	// Name is the object's name.
	Name string `json:"name"`
	// Generation is its metadata.generation in the snapshot.
	Generation int64 `json:"generation"`
}

// Quarantine resource and kind.
const (
	QuarantinesResource = "agentquarantines"
	KindQuarantine      = "AgentQuarantine"
)

// AgentQuarantine cuts the egress of the agent pods it names, on every
// node, as `agentbox sandbox quarantine` does: the agents keep running. It
// is cluster-scoped, so only whoever RBAC lets write it (cluster admins)
// can make or lift one; a pod's author cannot, by editing the pod or its
// labels: a pod once quarantined by this object stays so until the object
// is deleted. Each node's agent reports in status.nodes.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=aq,categories=agentbox
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.spec.reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="has(self.spec.pods) || has(self.spec.selector)",message="name pods, a selector, or both"
type AgentQuarantine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   QuarantineSpec   `json:"spec"`
	Status QuarantineStatus `json:"status,omitempty"`
}

// QuarantineSpec says which pods and why.
type QuarantineSpec struct {
	// Reason goes into each quarantined sandbox's trail.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Reason string `json:"reason"`
	// Pods by namespace and name.
	// +optional
	Pods []PodRef `json:"pods,omitempty"`
	// Selector picks pods by their labels.
	// +optional
	Selector *PodSelector `json:"selector,omitempty"`
}

// PodRef names one pod.
type PodRef struct {
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// PodSelector picks pods whose labels hold every one of MatchLabels, in
// Namespace (every namespace when empty).
type PodSelector struct {
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// +kubebuilder:validation:MinProperties=1
	MatchLabels map[string]string `json:"matchLabels"`
}

// QuarantineStatus is what each node's agent applied.
type QuarantineStatus struct {
	// Nodes by node name.
	// +optional
	Nodes map[string]NodeQuarantine `json:"nodes,omitempty"`
}

// NodeQuarantine is one node's part of a quarantine.
type NodeQuarantine struct {
	// AppliedAt is when this node's agent last quarantined a pod for it.
	// +optional
	AppliedAt *metav1.Time `json:"appliedAt,omitempty"`
	// Pods are the pods (NAMESPACE/NAME) quarantined on this node.
	// +optional
	Pods []string `json:"pods,omitempty"`
	// Error is the last failure to quarantine one of them (the shim then
	// froze or stopped it: see its trail).
	// +optional
	Error string `json:"error,omitempty"`
}

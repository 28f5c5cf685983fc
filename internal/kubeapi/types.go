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

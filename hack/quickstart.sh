#!/usr/bin/env bash
# One command on a fresh machine: installs Debian's packages and builds the
# toolchain (cached, hack/setup.sh quickstart), starts a
# private containerd with the agentbox runtime, and runs the sample agent
# under gVisor, printing what it did.
source "$(dirname "$0")/lib.sh"
need_root
"$REPO_ROOT/hack/setup.sh" quickstart
sock=$("$REPO_ROOT/hack/containerd.sh" start | tail -n1)
id=quickstart-$$
role=${AGENTBOX_ROLE:-baseline}
step "the role the agent runs under ($role):"
agentbox policy explain --config "$AGENTBOX_DEV/agentbox/config.toml" --role "$role" --containerd-namespace default | sed -n '1,8p'
step "running the sample agent under agentbox (ctr run --runtime io.containerd.agentbox.v1 --annotation agentbox.dev/role=$role)"
echo "----- agent output -----"
set +e
ctrq --address "$sock" run --rm --runtime io.containerd.agentbox.v1 --annotation "agentbox.dev/role=$role" \
  --env AWS_SECRET_ACCESS_KEY=not-for-the-agent "$AGENT_IMAGE" "$id"
rc=$?
set -e
echo "----- agent exited with status $rc -----"
step "its audit trail ($AGENTBOX_DEV/audit/$id.jsonl):"
agentbox audit tail --sandbox "$id" "$AGENTBOX_DEV/audit" | cut -c1-160
agentbox audit verify "$AGENTBOX_DEV/audit/$id.jsonl"
agentbox audit validate "$AGENTBOX_DEV/audit/$id.jsonl"
step "the agent's story (agentbox audit report --sandbox $id):"
agentbox audit report --sandbox "$id" "$AGENTBOX_DEV/audit"
agentbox audit report --sandbox "$id" -o html "$AGENTBOX_DEV/audit" >"$AGENTBOX_DEV/audit/$id.html"
echo "As one page (open it in a browser): $AGENTBOX_DEV/audit/$id.html"
cat <<EOT

The private containerd keeps running. Use it with:
  eval "\$(hack/containerd.sh env)"
  ctr run --rm --runtime io.containerd.agentbox.v1 $AGENT_IMAGE demo sh -c 'dmesg | head -3'
Stop it and remove every trace with: hack/containerd.sh stop
EOT
exit "$rc"

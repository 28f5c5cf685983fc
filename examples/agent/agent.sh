#!/bin/sh
# A stand-in for an AI agent: it does the kinds of things a coding agent
# does (reads its task, writes into its workspace, runs a tool, tries the
# network) and reports each step on stdout. Installed in the agent image as
# /usr/local/bin/agent.
set -u
say() { printf 'agent: %s\n' "$*"; }
say "kernel: $(dmesg 2>/dev/null | head -n1 | cut -c1-60)"
say "running as uid $(id -u) in $(pwd)"
for d in /workspace /tmp; do
  if echo "draft" > "$d/notes.txt" 2>/dev/null; then say "wrote $d/notes.txt"; else say "cannot write $d"; fi
done
if echo x > /etc/agent-was-here 2>/dev/null; then say "wrote /etc/agent-was-here"; else say "cannot write /etc (read-only)"; fi
say "environment variables visible: $(env | cut -d= -f1 | sort | tr '\n' ' ')"
say "processes: $(ps -o pid= | wc -l)"
say "done"

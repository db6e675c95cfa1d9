#!/usr/bin/env bash
# Offline plans of every stack at BASE and at the working tree, their diff and policy check,
# written as a PR comment. The PR workflow's plan job runs it; it runs locally the same way:
#
#   bash .ci/plan-diff.sh origin/main .local/plan-diff     # then read .local/plan-diff/comment.md
#
# Needs no cloud credentials (ragpool plan runs the program under Pulumi mocks). Exit 1 when
# head does not plan, a diff fails, a mandatory policy is violated or a CRD transition rule
# (x-kubernetes-validations reading oldSelf, policy/cel_eval.py) refuses the update from base to
# head of a custom resource in both plans; the comment says which.
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BASE_REF OUT_DIR" >&2
  exit 2
fi
base_ref="$1"
out="$2"
root="$(git rev-parse --show-toplevel)"
py="${PYTHON:-$root/.venv/bin/python}"
head_label="${HEAD_SHA:-$(git -C "$root" rev-parse HEAD)}"
base_sha="$(git -C "$root" rev-parse --verify "$base_ref^{commit}")" || { echo "$0: unknown base $base_ref" >&2; exit 2; }
mkdir -p "$out"
base_tree="$(mktemp -d)"
trap 'git -C "$root" worktree remove --force "$base_tree" >/dev/null 2>&1; rm -rf "$base_tree"' EXIT
git -C "$root" worktree add -q --detach "$base_tree" "$base_sha"

failed=0
# Stacks whose PR preview does not reach the cluster (ragpool:previewRoleArn unset, head's config):
# the comment's first line says so, since pulumi-kubernetes only warns in the preview's log.
if ! modes="$(cd "$root" && "$py" -m infra.cli config preview --stack dev --stack prod 2> "$out/preview-modes.err")"; then
  failed=1
  modes="dev unknown"$'\n'"prod unknown"
fi
off="$(awk '$2 != "on" {printf "%s%s", sep, $1; sep=", "}' <<< "$modes")"
{
  echo "<!-- ragpool-plan-diff -->"
  if [ -n "$off" ]; then
    echo "> :warning: **Kubernetes objects were not previewed against the cluster** for $off: \`ragpool:previewRoleArn\` is unset (or the stack config does not parse), so \`pulumi preview\` runs on a hosted runner and pulumi-kubernetes previews every Kubernetes object client-side only (README: Deploying for real)."
    echo
  fi
  echo "### Offline plan diff"
  echo "base \`${base_sha:0:7}\` → head \`${head_label:0:7}\` (merged into base), from \`ragpool plan\` under Pulumi mocks: no cloud credentials involved."
} > "$out/comment.md"
for stack in dev prod; do
  # Each side runs its own program: python -m imports infra/ from the working directory, and the
  # plan's language-host child (infra/langhost/mock_exec.py) imports that same infra/.
  if ! (cd "$root" && "$py" -m infra.cli plan --stack "$stack" --format json --out "$out/head-$stack.json" \
      > /dev/null 2> "$out/head-$stack.err"); then
    failed=1
    printf '\n#### %s: head does not plan\n~~~\n%s\n~~~\n' "$stack" "$(tail -c 4000 "$out/head-$stack.err")" >> "$out/comment.md"
    continue
  fi
  note=""
  if ! (cd "$base_tree" && "$py" -m infra.cli plan --stack "$stack" --format json \
      --out "$out/base-$stack.json" > /dev/null 2> "$out/base-$stack.err"); then
    printf '{"project": "ragpool", "stack": "%s", "resources": []}\n' "$stack" > "$out/base-$stack.json"
    note=" (the base does not plan; diffed against an empty stack)"
  fi
  (cd "$root" && "$py" -m infra.cli plan-diff "$out/base-$stack.json" "$out/head-$stack.json") > "$out/diff-$stack.txt" 2>&1 || failed=1
  (cd "$root" && "$py" -m policy.offline --plan "$out/head-$stack.json") > "$out/policy-$stack.txt" 2>&1 || failed=1
  # Transition rules compare an object's old and new version: the API server runs them on update.
  (cd "$root" && "$py" -m policy.cel_eval transitions "$out/base-$stack.json" "$out/head-$stack.json") \
    > "$out/cel-$stack.txt" 2>&1 || failed=1
  {
    printf '\n#### %s%s\n\n<details><summary>%s</summary>\n\n~~~diff\n' "$stack" "$note" "$(head -n1 "$out/diff-$stack.txt")"
    cat "$out/diff-$stack.txt"
    printf '~~~\n</details>\n\nPolicy check: **%s**\n' "$(tail -n1 "$out/policy-$stack.txt")"
    if grep -q '^\[mandatory\]' "$out/policy-$stack.txt"; then
      printf '\n~~~\n'; grep '^\[mandatory\]' "$out/policy-$stack.txt"; printf '~~~\n'
    fi
    printf '\nCRD transition rules (base → head): **%s**\n' "$(tail -n1 "$out/cel-$stack.txt")"
    if [ "$(wc -l < "$out/cel-$stack.txt")" -gt 1 ]; then
      printf '\n~~~\n'; head -n -1 "$out/cel-$stack.txt"; printf '~~~\n'
    fi
  } >> "$out/comment.md"
done
exit "$failed"

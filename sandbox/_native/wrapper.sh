# toolgym exec wrapper (POSIX sh). $1 is the command. Runs it, then records and kills every process
# it left behind, so no exec leaks processes into the next and the ledger sees the attempt.
TOOLGYM_CMD=$1
# Tell the host the sandbox is up: a first stderr line the host strips. The command runs after
# it, so it can neither suppress nor move it.
if [ -n "$TOOLGYM_STARTED_MARK" ]; then
  echo "$TOOLGYM_STARTED_MARK" >&2
fi
unset TOOLGYM_STARTED_MARK
# Limits first (lowering needs no privilege and cannot be undone by the command).
IFS_SAVED=$IFS; IFS=,
for flag in $TOOLGYM_ULIMITS; do IFS=$IFS_SAVED; ulimit $flag 2>/dev/null; IFS=,; done
IFS=$IFS_SAVED
unset TOOLGYM_ULIMITS IFS_SAVED
if [ -n "$TOOLGYM_TIMEOUT" ]; then
  # docker: no host process to kill, so the command runs under coreutils timeout
  T=$TOOLGYM_TIMEOUT; unset TOOLGYM_TIMEOUT
  timeout -s KILL "$T" /bin/sh -c "$TOOLGYM_CMD"
else
  (eval "$TOOLGYM_CMD")
fi
rc=$?
unset LD_PRELOAD
me=$$
n=0
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" = 1 ] && continue
  [ "$pid" = "$me" ] && continue
  # A process may exit between the glob and the read: the brace group keeps the shell's own
  # "cannot open" message (a redirection error, raised before an inner 2>/dev/null applies) out
  # of the command's stderr, which the agent sees.
  { read -r st < "$p/stat"; } 2>/dev/null || continue
  st=${st##*) }
  [ "${st%% *}" = Z ] && continue   # zombies are already dead
  cmd=$( { tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null)
  [ -n "$cmd" ] || { read -r cmd < "$p/comm"; } 2>/dev/null   # mid-exec: no cmdline yet
  n=$((n + 1))
  [ "$n" -le 20 ] && echo "leftover $pid $cmd" >> "$TOOLGYM_LOG_DIR/events"
done
[ "$n" -gt 0 ] && kill -9 -1 2>/dev/null
exit $rc

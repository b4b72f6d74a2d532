#!/bin/sh
# A well-behaved MAP agent over stdio: connects, registers, answers nothing, and exits 0 on a
# stop control message or at EOF. Lines it reads are appended to $LOG when set.
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"protocolVersion":1,"participantType":"agent","name":"echo"}}'
printf '%s\n' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{"name":"echo"}}'
while IFS= read -r line; do
  [ -n "$LOG" ] && printf '%s\n' "$line" >> "$LOG"
  case "$line" in
    *'"control":"stop"'*) exit 0 ;;
  esac
done
exit 0

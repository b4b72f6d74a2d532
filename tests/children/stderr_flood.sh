#!/bin/sh
# Registers, floods stderr with 5000 lines, then keeps reading until EOF.
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"agent"}}'
printf '%s\n' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{}}'
i=0
while [ "$i" -lt 5000 ]; do
  echo "noise line $i" >&2
  i=$((i + 1))
done
echo "flood done" >&2
while IFS= read -r line; do :; done

#!/bin/sh
# Registers, then prints lines that are not JSON-RPC on its MAP channel (stdout), then keeps
# reading until EOF.
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"agent"}}'
printf '%s\n' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{}}'
echo "Loading..."
echo "[1, 2, oops"
printf '%s\n' '{"jsonrpc":"2.0","id":3,"method":"map/agents/list"}'
while IFS= read -r line; do :; done

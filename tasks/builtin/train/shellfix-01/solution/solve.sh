#!/bin/bash
set -e
mkdir -p "$(dirname 'run.sh')"
cat > 'run.sh' <<'HARNESSRL_EOF'
#!/bin/bash
WORD="ember"
echo "$WORD"
HARNESSRL_EOF

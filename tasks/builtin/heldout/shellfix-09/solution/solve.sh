#!/bin/bash
set -e
mkdir -p "$(dirname 'run.sh')"
cat > 'run.sh' <<'HARNESSRL_EOF'
#!/bin/bash
echo "fjord"
HARNESSRL_EOF

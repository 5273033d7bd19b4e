#!/bin/bash
set -e
mkdir -p "$(dirname 'run.sh')"
cat > 'run.sh' <<'HARNESSRL_EOF'
#!/bin/bash
if true; then
  echo "zephyr"
fi
HARNESSRL_EOF

#!/bin/bash
set -e
mkdir -p "$(dirname 'run.sh')"
cat > 'run.sh' <<'HARNESSRL_EOF'
#!/bin/bash
N=3
if [ "$N" -eq 3 ]; then echo "heron"; fi
HARNESSRL_EOF

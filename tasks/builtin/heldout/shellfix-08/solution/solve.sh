#!/bin/bash
set -e
mkdir -p "$(dirname 'run.sh')"
cat > 'run.sh' <<'HARNESSRL_EOF'
#!/bin/bash
echo "indigo" > word.txt
cat word.txt
HARNESSRL_EOF

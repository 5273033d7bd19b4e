#!/bin/bash
set -e
mkdir -p "$(dirname 'run.sh')"
cat > 'run.sh' <<'HARNESSRL_EOF'
#!/bin/bash
for w in "harbor"; do
  echo "$w"
done
HARNESSRL_EOF

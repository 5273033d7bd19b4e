#!/bin/bash
WORD="ember"
echo "$WROD"

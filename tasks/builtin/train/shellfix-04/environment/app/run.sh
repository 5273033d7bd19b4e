#!/bin/bash
WORD="velvet"
echo "$WROD"

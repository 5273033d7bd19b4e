#!/bin/bash
echo "indigo" > word.txt
cat wrd.txt

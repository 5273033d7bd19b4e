#!/bin/bash
echo jasper > answer.txt

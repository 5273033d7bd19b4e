#!/bin/bash
echo banana > answer.txt

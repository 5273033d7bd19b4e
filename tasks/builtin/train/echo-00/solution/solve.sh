#!/bin/bash
echo iris > answer.txt
